//! Reads a report's DOM as a browser dumped it (after the page's own check script ran) and
//! says whether every chart rendered: the page marked itself `data-check="ok"` (every chart
//! drawn, no two texts of a chart overlapping, no script error, nothing blocked), the number of
//! charts is the number announced, and each chart's `<svg>` holds enough elements. Each chart's
//! drawn width and the page's are read too, for a test of the layout.

use crate::page::MIN_ELEMENTS;

/// One chart as the browser saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    /// The chart's id (`data-chart`).
    pub chart: String,
    /// Elements inside its `<svg>`, as counted by the page's script.
    pub elements: usize,
    /// Its drawn width in CSS pixels, as the page's script measured it.
    pub width: u32,
    /// The width of the page's body (what a chart at full width takes).
    pub page_width: u32,
}

/// The value of attribute `name` in the start tag `tag` (its text up to `>`).
fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let key = format!(" {name}=\"");
    let start = tag.find(&key)? + key.len();
    let len = tag[start..].find('"')?;
    Some(&tag[start..start + len])
}

/// Checks a dumped DOM; `Ok` lists every chart with its element count, `Err` says what is
/// wrong in one line.
pub fn check_dom(dom: &str) -> Result<Vec<Rendered>, String> {
    let body_at = dom.find("<body").ok_or("no <body> in the page")?;
    let body_tag = &dom[body_at..body_at + dom[body_at..].find('>').ok_or("unclosed <body>")?];
    let verdict = attr(body_tag, "data-check").ok_or("the page's check script never ran")?;
    if verdict != "ok" {
        return Err(format!("the page reports {verdict}"));
    }
    let page_width: u32 = attr(body_tag, "data-width")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let want: usize = attr(body_tag, "data-charts")
        .and_then(|n| n.parse().ok())
        .ok_or("the page does not say how many charts it has")?;
    let mut charts = Vec::new();
    let mut rest = &dom[body_at..];
    while let Some(at) = rest.find("<figure class=\"chart\"") {
        let tag_end = rest[at..].find('>').ok_or("unclosed <figure>")? + at;
        let tag = &rest[at..tag_end];
        let chart = attr(tag, "data-chart").unwrap_or("?").to_string();
        let elements: usize = attr(tag, "data-elements")
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| format!("chart {chart} was never counted"))?;
        let close = rest[tag_end..]
            .find("</figure>")
            .ok_or_else(|| format!("chart {chart} is not closed"))?
            + tag_end;
        let inner = &rest[tag_end..close];
        // Count again from the dump: a chart must really hold its drawing.
        let in_dump = inner.matches('<').count() - inner.matches("</").count();
        if !inner.contains("<svg") || elements < MIN_ELEMENTS || in_dump < MIN_ELEMENTS {
            return Err(format!(
                "chart {chart} did not render ({elements} elements)"
            ));
        }
        let width = attr(tag, "data-width")
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        charts.push(Rendered {
            chart,
            elements,
            width,
            page_width,
        });
        rest = &rest[close..];
    }
    if charts.len() != want {
        return Err(format!("expected {want} charts, found {}", charts.len()));
    }
    Ok(charts)
}

/// What in a page's source could load something from elsewhere (a URL other than the SVG
/// namespace, a `src=`, an `@import`, a `url(`); a self-contained page has none.
pub fn external_references(html: &str) -> Vec<String> {
    let mut found = Vec::new();
    for needle in ["http://", "https://", "src=", "@import", "url(", "//cdn"] {
        for (at, _) in html.match_indices(needle) {
            if !html[..at].ends_with("xmlns=\"") {
                let end = (at + 60).min(html.len());
                let end = (end..=html.len())
                    .find(|&i| html.is_char_boundary(i))
                    .unwrap_or(html.len());
                found.push(html[at..end].to_string());
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dumped(verdict: &str, figures: &str, n: usize) -> String {
        format!("<html><body data-charts=\"{n}\" data-check=\"{verdict}\">{figures}</body></html>")
    }

    fn figure(id: &str, elements: usize) -> String {
        let inner = "<line></line>".repeat(elements.saturating_sub(1));
        format!("<figure class=\"chart\" data-chart=\"{id}\" data-elements=\"{elements}\"><svg>{inner}</svg></figure>")
    }

    #[test]
    fn a_dom_with_every_chart_drawn_passes_and_any_flaw_fails() {
        let good = dumped("ok", &(figure("a", 40) + &figure("b", 12)), 2);
        let got = check_dom(&good).expect("passes");
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].elements, 12);
        // The page's own script saw a problem.
        assert!(check_dom(&dumped("fail: b", &figure("b", 40), 1)).is_err());
        // A chart with next to nothing in it.
        assert!(check_dom(&dumped("ok", &(figure("a", 40) + &figure("b", 2)), 2)).is_err());
        // A chart missing.
        assert!(check_dom(&dumped("ok", &figure("a", 40), 2)).is_err());
        // The script never ran (a page loaded with scripts off, or not at all).
        assert!(check_dom("<html><body data-charts=\"0\"></body></html>").is_err());
    }

    #[test]
    fn only_the_svg_namespace_may_name_a_url() {
        let svg = "<svg xmlns=\"http://www.w3.org/2000/svg\"></svg>";
        assert!(external_references(svg).is_empty());
        assert_eq!(external_references("<img src=\"x.png\">").len(), 1);
        assert_eq!(
            external_references("<link href=\"https://cdn.x/y.css\">").len(),
            2
        );
    }
}
