//! The HTML page: a title, a summary, tables and charts in one self-contained file. A
//! Content-Security-Policy forbids every fetch (no CDN, fonts or images from anywhere), so
//! the page works offline by construction. Every string put on the page is escaped, and the
//! SVG of each chart is inlined as produced by [`crate::chart`]. Escaping is not the only
//! defence: the policy allows no inline script or style but the page's own, each named by its
//! SHA-256 ([`csp`]), so markup that slipped through unescaped could not run a script.
//!
//! A tiny inline script in `<head>` collects script errors and blocked loads; another at the
//! end of `<body>` checks, once the page is laid out, that every chart has an `<svg>`
//! with at least [`MIN_ELEMENTS`] elements and a visible size, that no two texts of a chart
//! overlap (their boxes as laid out, [`OVERLAP_SLACK_PX`]), and that no script error
//! occurred and nothing tried to load from elsewhere; it writes the outcome on
//! `<body data-check="ok">` (or `fail: …`), each chart's element count and drawn width on its
//! figure (`data-elements`, `data-width`) and the page's width on `<body data-width>`, for
//! [`crate::check`] to read. Charts take the page's full width (their `viewBox` scales).

use std::fmt::Write;

use base64::Engine;
use sha2::{Digest, Sha256};

/// Fewer elements than this in a chart's `<svg>` means it did not draw (an axis alone has more).
pub const MIN_ELEMENTS: usize = 10;

/// Two texts of a chart whose boxes share more than this many pixels both across and down
/// overlap (a box is the font's full line height, so neighbours a pixel apart may touch).
pub const OVERLAP_SLACK_PX: u32 = 1;

/// Escapes text for HTML and SVG content and attribute values.
pub fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            // Control characters have no business in a page (and some are invalid in XML);
            // text-direction and invisible characters would make a name read as another.
            c if (c.is_control() && c != '\n' && c != '\t') || gabp_rt::display::invisible(c) => {
                o.push('\u{fffd}')
            }
            c => o.push(c),
        }
    }
    o
}

/// A page under construction.
#[derive(Debug, Default)]
pub struct Page {
    title: String,
    body: String,
    charts: usize,
}

const STYLE: &str = "body{font-family:sans-serif;margin:24px;color:#222;max-width:1800px}\
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}\
table{border-collapse:collapse;margin:8px 0;font-size:14px}td,th{padding:3px 8px;border-bottom:1px solid #eee;text-align:left}\
td{white-space:nowrap}td.t{white-space:normal;min-width:16em;overflow-wrap:anywhere}\
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}\
figure{margin:8px 0}figure.chart svg{display:block;width:100%;height:auto}\
figcaption{font-size:13px;color:#555}p.note{color:#555;font-size:13px}\
dl{display:grid;grid-template-columns:max-content auto;gap:2px 16px}dt{color:#555}dd{margin:0}";

/// In `<head>`, before anything else runs: collects script errors and blocked loads.
/// A violation is reported by a task queued after the parser moved on, so an error seen after the
/// verdict was written writes it again.
const WATCH: &str = r#"window.reportErrors=[];
window.reportError=function(m){window.reportErrors.push(m);if(window.reportVerdict)window.reportVerdict();};
window.addEventListener('error',function(e){window.reportError(String(e.message));});
document.addEventListener('securitypolicyviolation',function(e){window.reportError('blocked '+e.blockedURI);});"#;

/// At the end of `<body>`: checks every chart and writes the verdict on `<body>`.
const SCRIPT: &str = r#"(function(){
var bad=[],figs=document.querySelectorAll('figure.chart');
function overlap(s){
 var ts=s.querySelectorAll('text'),bs=[];
 for(var i=0;i<ts.length&&i<4000;i++){
  var t=ts[i].textContent.trim(),b=ts[i].getBoundingClientRect();
  if(t&&b.width>0&&b.height>0)bs.push([b,t]);
 }
 for(var a=0;a<bs.length;a++)for(var c=a+1;c<bs.length;c++){
  var p=bs[a][0],q=bs[c][0];
  if(Math.min(p.right,q.right)-Math.max(p.left,q.left)>SLACK&&Math.min(p.bottom,q.bottom)-Math.max(p.top,q.top)>SLACK)
   return JSON.stringify(bs[a][1])+' and '+JSON.stringify(bs[c][1]);
 }
 return '';
}
for(var i=0;i<figs.length;i++){
 var f=figs[i],s=f.querySelector('svg'),n=s?s.querySelectorAll('*').length:0,r=s?s.getBoundingClientRect():null;
 f.setAttribute('data-elements',String(n));
 f.setAttribute('data-width',String(r?Math.round(r.width):0));
 if(!s||n<MIN||!r||r.width<10||r.height<10)bad.push(f.getAttribute('data-chart'));
 var o=s?overlap(s):'';
 if(o)bad.push(f.getAttribute('data-chart')+': text overlaps, '+o);
}
document.body.setAttribute('data-width',String(Math.round(document.body.getBoundingClientRect().width)));
var want=Number(document.body.getAttribute('data-charts'));
if(figs.length!==want)bad.push('expected '+want+' charts, found '+figs.length);
window.reportVerdict=function(){
 var all=bad.concat(window.reportErrors||['the error watch never ran']);
 document.body.setAttribute('data-check',all.length?'fail: '+all.join(', '):'ok');
};
window.reportVerdict();
})();"#;

impl Page {
    /// A page titled `title`.
    pub fn new(title: &str) -> Page {
        let mut p = Page {
            title: title.to_string(),
            ..Page::default()
        };
        let _ = writeln!(p.body, "<h1>{}</h1>", escape(title));
        p
    }

    /// A section heading.
    pub fn heading(&mut self, text: &str) -> &mut Self {
        let _ = writeln!(self.body, "<h2>{}</h2>", escape(text));
        self
    }

    /// A short paragraph.
    pub fn note(&mut self, text: &str) -> &mut Self {
        let _ = writeln!(self.body, "<p class=\"note\">{}</p>", escape(text));
        self
    }

    /// Name/value pairs.
    pub fn summary(&mut self, pairs: &[(&str, String)]) -> &mut Self {
        self.body.push_str("<dl class=\"summary\">\n");
        for (k, v) in pairs {
            let _ = writeln!(self.body, "<dt>{}</dt><dd>{}</dd>", escape(k), escape(v));
        }
        self.body.push_str("</dl>\n");
        self
    }

    /// A table; a column whose header ends in `#` is numeric (right-aligned), one whose header
    /// ends in `~` is free text that may wrap (a long value); every other cell stays on one
    /// line (ids, times). The marker is not shown.
    pub fn table(&mut self, headers: &[&str], rows: &[Vec<String>]) -> &mut Self {
        let class: Vec<&str> = headers
            .iter()
            .map(|h| match h.chars().last() {
                Some('#') => " class=\"n\"",
                Some('~') => " class=\"t\"",
                _ => "",
            })
            .collect();
        self.body.push_str("<table>\n<tr>");
        for (h, cls) in headers.iter().zip(&class) {
            let _ = write!(
                self.body,
                "<th{cls}>{}</th>",
                escape(h.strip_suffix(['#', '~']).unwrap_or(h))
            );
        }
        self.body.push_str("</tr>\n");
        for row in rows {
            self.body.push_str("<tr>");
            for (i, cell) in row.iter().enumerate() {
                let cls = class.get(i).copied().unwrap_or("");
                let _ = write!(self.body, "<td{cls}>{}</td>", escape(cell));
            }
            self.body.push_str("</tr>\n");
        }
        self.body.push_str("</table>\n");
        self
    }

    /// A chart: `svg` as drawn by [`crate::chart`] (trusted markup: its labels are escaped
    /// there), `id` a short stable name the checks report, `caption` shown under it.
    pub fn chart(&mut self, id: &str, caption: &str, svg: &str) -> &mut Self {
        self.charts += 1;
        let _ = writeln!(
            self.body,
            "<figure class=\"chart\" data-chart=\"{}\">\n{}\n<figcaption>{}</figcaption></figure>",
            escape(id),
            svg.trim(),
            escape(caption)
        );
        self
    }

    /// The finished page.
    pub fn finish(&self) -> String {
        let check = check_script();
        format!(
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n\
             <meta http-equiv=\"Content-Security-Policy\" content=\"{}\">\n\
             <meta name=\"viewport\" content=\"width=device-width\">\n\
             <title>{}</title>\n<style>{STYLE}</style>\n<script>{WATCH}</script></head>\n\
             <body data-charts=\"{}\" data-check=\"pending\">\n{}\
             <script>{check}</script>\n</body></html>\n",
            csp(),
            escape(&self.title),
            self.charts,
            self.body,
        )
    }
}

/// The check script as the page carries it.
fn check_script() -> String {
    SCRIPT
        .replace("MIN", &MIN_ELEMENTS.to_string())
        .replace("SLACK", &OVERLAP_SLACK_PX.to_string())
}

/// A CSP hash source for an inline element's exact text: `'sha256-…'`.
pub fn hash_source(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    format!(
        "'sha256-{}'",
        base64::engine::general_purpose::STANDARD.encode(digest)
    )
}

/// The page's Content-Security-Policy: nothing may be fetched, and the only style and scripts
/// allowed are the page's own, by hash (no `'unsafe-inline'`, so an injected `<script>`, inline
/// event handler or `style` attribute does nothing).
pub fn csp() -> String {
    format!(
        "default-src 'none'; style-src {}; script-src {} {}",
        hash_source(STYLE),
        hash_source(WATCH),
        hash_source(&check_script())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_string_is_escaped() {
        let evil = "<script>alert(1)</script>";
        let mut p = Page::new(evil);
        p.heading(evil)
            .note(evil)
            .summary(&[(evil, evil.to_string())])
            .table(&[evil], &[vec![evil.to_string()]])
            .chart(evil, evil, "<svg></svg>");
        let html = p.finish();
        // The only scripts on the page are the checker's two.
        assert_eq!(html.matches("<script>").count(), 2);
        assert!(!html.contains("alert(1)</script>"));
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(html.contains("data-charts=\"1\""));
        assert_eq!(escape("a\u{1}b'\""), "a\u{fffd}b&#39;&quot;");
        // A name cannot read as another: `a/\u{202e}gnp.exe` would show as "a/exe.png".
        assert_eq!(
            escape("a/\u{202e}gnp.exe\u{200b}"),
            "a/\u{fffd}gnp.exe\u{fffd}"
        );
    }

    #[test]
    fn the_policy_allows_only_the_pages_own_inline_code_by_hash() {
        let html = Page::new("t").finish();
        let policy = csp();
        assert!(html.contains(&format!("content=\"{policy}\"")));
        assert!(!policy.contains("unsafe"), "{policy}");
        // One hash per inline element, each of the element's exact text as the page holds it.
        let between = |open: &str, close: &str| -> Vec<String> {
            html.split(open)
                .skip(1)
                .map(|rest| rest.split(close).next().unwrap_or_default().to_string())
                .collect()
        };
        let inline: Vec<String> = between("<script>", "</script>")
            .into_iter()
            .chain(between("<style>", "</style>"))
            .collect();
        assert_eq!(inline.len(), 3);
        for text in &inline {
            assert!(policy.contains(&hash_source(text)), "{text}");
        }
        // The SHA-256 of "" in CSP form (a known vector).
        assert_eq!(
            hash_source(""),
            "'sha256-47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU='"
        );
    }
}
