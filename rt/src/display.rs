//! Showing untrusted names in tables: channels, app names, routes, methods and bridge strings
//! are chosen by a mod or a bridge, so before they reach a terminal their control characters
//! (escape sequences, CR, NUL, bidirectional overrides) are escaped and their length is capped.
//! JSON output never goes through here: it stays exact. Where untrusted text is kept or passed
//! on rather than shown (a bridge's label, a mod's tool descriptions for an assistant),
//! [`strip`] removes those characters instead. Byte counts and times for tables are formatted
//! here too, the same way in every table.

use std::borrow::Cow;

/// Characters a name may show in a table column.
pub const NAME_CHARS: usize = 48;

/// `s` escaped and cut to [`NAME_CHARS`] characters, for a table cell.
pub fn name(s: &str) -> String {
    text(s, NAME_CHARS)
}

/// `s` with control and text-direction characters escaped (`\n`, `\r`, `\t`, `\\`, others as
/// `\u{1b}`), cut to at most `max` characters with a trailing `…` when it was longer.
pub fn text(s: &str, max: usize) -> String {
    let mut out = String::new();
    let mut shown = 0;
    for c in s.chars() {
        let piece: Cow<str> = match c {
            '\n' => "\\n".into(),
            '\r' => "\\r".into(),
            '\t' => "\\t".into(),
            '\\' => "\\\\".into(),
            c if hidden(c) => format!("\\u{{{:x}}}", u32::from(c)).into(),
            c => c.to_string().into(),
        };
        // Whole escapes only: one is never cut in half.
        let width = piece.chars().count();
        if shown + width > max {
            out.push('…');
            return out;
        }
        out.push_str(&piece);
        shown += width;
    }
    out
}

/// `s` without control characters (but `\n` and `\t` when `keep_lines`) and without the
/// invisible and text-direction characters a reader cannot see (`hidden`).
pub fn strip(s: &str, keep_lines: bool) -> String {
    s.chars()
        .filter(|&c| (keep_lines && (c == '\n' || c == '\t')) || !hidden(c))
        .collect()
}

/// A byte count for a table: `512 B`, `9.6 MiB` (binary units).
pub fn bytes(n: u64) -> String {
    bytesize::ByteSize::b(n).display().iec().to_string()
}

/// Nanoseconds since the Unix epoch as RFC 3339 in UTC, to the second: `2026-11-30T13:16:43Z`.
pub fn utc(ns: u64) -> String {
    let secs = i64::try_from(ns / 1_000_000_000).unwrap_or(i64::MAX);
    match jiff::Timestamp::from_second(secs) {
        Ok(t) => t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        Err(_) => "-".into(),
    }
}

/// Invisible and text-direction characters (one list for every table, page, route name and
/// MCP text): what `hidden` adds to the controls.
pub fn invisible(c: char) -> bool {
    matches!(c,
        '\u{00ad}' | '\u{034f}' | '\u{061c}' | '\u{115f}' | '\u{1160}' | '\u{17b4}'
        | '\u{17b5}' | '\u{180b}'..='\u{180f}' | '\u{200b}'..='\u{200f}'
        | '\u{2028}'..='\u{202e}' | '\u{2060}'..='\u{2064}' | '\u{2066}'..='\u{206f}'
        | '\u{3164}' | '\u{fe00}'..='\u{fe0f}' | '\u{feff}' | '\u{ffa0}'
        | '\u{fff9}'..='\u{fffb}' | '\u{e0000}'..='\u{e007f}' | '\u{e0100}'..='\u{e01ef}')
}

/// Characters that change how a terminal shows what follows, or show nothing themselves: C0 and
/// C1 controls, bidirectional marks, embeddings, overrides and isolates, zero-width and other
/// invisible format characters, fillers and joiners that render as nothing (the combining
/// grapheme joiner, Hangul fillers, Khmer inherent vowels), variation selectors, interlinear
/// annotation marks, and Unicode tags (invisible text some models still read).
fn hidden(c: char) -> bool {
    c.is_control() || invisible(c)
}

/// How a column's cells line up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Text.
    Left,
    /// Numbers.
    Right,
}

/// A table for a terminal: each column as wide as its widest cell (or its header), a cell past
/// the column's cap cut with `…` (commands show the whole value in `--json`). Cells are text
/// already made safe ([`name`]); widths count characters.
#[derive(Debug)]
pub struct Table {
    columns: Vec<(String, Align, usize)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these columns: header, alignment, and the widest a cell may show.
    pub fn new(columns: &[(&str, Align, usize)]) -> Table {
        Table {
            columns: columns
                .iter()
                .map(|&(h, a, cap)| (h.to_string(), a, cap.max(2)))
                .collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (missing cells are empty, extra ones ignored).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as lines, two spaces between columns, no trailing spaces.
    pub fn render(&self) -> String {
        let cut = |s: &str, cap: usize| -> String {
            if s.chars().count() <= cap {
                s.to_string()
            } else {
                let mut t: String = s.chars().take(cap - 1).collect();
                t.push('…');
                t
            }
        };
        let cells: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|r| {
                self.columns
                    .iter()
                    .enumerate()
                    .map(|(i, c)| cut(r.get(i).map_or("", String::as_str), c.2))
                    .collect()
            })
            .collect();
        let widths: Vec<usize> = self
            .columns
            .iter()
            .enumerate()
            .map(|(i, c)| {
                cells
                    .iter()
                    .map(|r| r[i].chars().count())
                    .chain([c.0.chars().count()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |r: &[String]| -> String {
            let mut out = String::new();
            for (i, cell) in r.iter().enumerate() {
                let pad = widths[i].saturating_sub(cell.chars().count());
                if i > 0 {
                    out.push_str("  ");
                }
                match self.columns[i].1 {
                    Align::Left => {
                        out.push_str(cell);
                        out.extend(std::iter::repeat_n(' ', pad));
                    }
                    Align::Right => {
                        out.extend(std::iter::repeat_n(' ', pad));
                        out.push_str(cell);
                    }
                }
            }
            out.trim_end().to_string()
        };
        let header: Vec<String> = self.columns.iter().map(|c| c.0.clone()).collect();
        let mut out = line(&header);
        out.push('\n');
        for r in &cells {
            out.push_str(&line(r));
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_fits_its_columns_to_what_they_show_and_cuts_past_the_cap() {
        let mut t = Table::new(&[("ROUTE", Align::Left, 24), ("FRAMES", Align::Right, 12)]);
        t.row(vec!["a-route-named-thirteen".into(), "7".into()]);
        t.row(vec!["x".repeat(40), "123456".into()]);
        let text = t.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], format!("{:<24}  FRAMES", "ROUTE"));
        assert_eq!(
            lines[1],
            format!("{:<24}  {:>6}", "a-route-named-thirteen", "7")
        );
        assert_eq!(lines[2], format!("{}…  123456", "x".repeat(23)));
        // Every line's second column ends at the same place.
        assert!(lines
            .iter()
            .all(|l| l.chars().count() == lines[0].chars().count()));
    }

    #[test]
    fn escapes_and_truncates() {
        assert_eq!(name("world/tick"), "world/tick");
        assert_eq!(name("a\u{1b}[2Jb\r\0c"), "a\\u{1b}[2Jb\\r\\u{0}c");
        assert_eq!(name("rtl\u{202e}x"), "rtl\\u{202e}x");
        assert_eq!(name("tab\there\\"), "tab\\there\\\\");
        assert_eq!(name("héllo✓"), "héllo✓");
        let long = "x".repeat(100_000);
        let shown = name(&long);
        assert_eq!(shown.chars().count(), NAME_CHARS + 1);
        assert!(shown.ends_with('…'));
        // An escape is never cut in half.
        let s = format!("{}\u{1b}", "y".repeat(NAME_CHARS - 2));
        assert!(name(&s).ends_with("yy…"), "{}", name(&s));
    }

    #[test]
    fn strip_removes_what_a_reader_cannot_see() {
        let s = "a\u{1b}[2Jb\u{202e}c\u{2066}d\u{200b}e\u{feff}f\u{061c}g\u{85}h\u{e0041}i\r\n\tj";
        assert_eq!(strip(s, true), "a[2Jbcdefghi\n\tj");
        assert_eq!(strip(s, false), "a[2Jbcdefghij");
        assert_eq!(strip("héllo ✓ 日本", false), "héllo ✓ 日本");
    }

    #[test]
    fn bytes_and_times() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(16 << 20), "16.0 MiB");
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(1_700_000_000_123_000_000), "2023-11-14T22:13:20Z");
    }
}
