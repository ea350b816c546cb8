//! Aligned plain-text tables for human output.

/// Text a user typed, as the CLI prints it (control and bidirectional characters escaped).
pub fn escape(text: &str) -> String {
    orch_core::text::escape(text).into_owned()
}

/// Renders rows under a header, each column as wide as its widest cell, two spaces apart. Cells
/// are escaped ([`orch_core::text::escape`]): a name or reason holding a terminal escape or a
/// line break prints as `\u{1b}` or `\n`, and cannot clear the screen or forge a row.
pub fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| row.iter().map(|c| escape(c)).collect())
        .collect();
    let rows = &rows;
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<width$}  ", width = widths[i]));
            }
        }
        out.trim_end().to_string()
    };
    let mut out = line(header.to_vec());
    out.push('\n');
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn columns_align() {
        let text = super::render(&["A", "BB"], &[vec!["xyz".into(), "1".into()]]);
        assert_eq!(text, "A    BB\nxyz  1\n");
    }

    #[test]
    fn cells_are_escaped_and_aligned_as_printed() {
        let text = super::render(
            &["NAME", "X"],
            &[
                vec!["a\u{1b}[2J\nb".into(), "1".into()],
                vec!["\u{202e}c".into(), "2".into()],
            ],
        );
        assert_eq!(
            text,
            "NAME           X\na\\u{1b}[2J\\nb  1\n\\u{202e}c      2\n"
        );
    }
}
