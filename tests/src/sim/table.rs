//! Plain-text tables for the `sim` binary's output.

use std::fmt;

/// A titled table of strings, printed with aligned columns (first column left, others right).
#[derive(Debug, Clone, Default)]
pub struct Table {
    title: String,
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with `title` and column names.
    pub fn new(title: impl Into<String>, header: &[&str]) -> Self {
        Table {
            title: title.into(),
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Append a row (missing cells print empty).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cols = self.header.len();
        let mut width: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate().take(cols) {
                width[i] = width[i].max(c.chars().count());
            }
        }
        writeln!(f, "{}", self.title)?;
        let line = |f: &mut fmt::Formatter<'_>, cells: &[String]| -> fmt::Result {
            for (i, w) in width.iter().enumerate() {
                let c = cells.get(i).map_or("", String::as_str);
                if i == 0 {
                    write!(f, "{c:<w$}")?;
                } else {
                    write!(f, "  {c:>w$}")?;
                }
            }
            writeln!(f)
        };
        line(f, &self.header)?;
        let total: usize = width.iter().sum::<usize>() + 2 * cols.saturating_sub(1);
        writeln!(f, "{}", "-".repeat(total))?;
        for r in &self.rows {
            line(f, r)?;
        }
        Ok(())
    }
}

/// An integer with thousands separators: `73794` → `73,794`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// Bytes in human units (decimal: kB, MB, GB), three significant figures.
pub fn bytes(n: u64) -> String {
    let units = ["B", "kB", "MB", "GB", "TB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1000.0 && u + 1 < units.len() {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_groups_digits_by_three() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(73_794), "73,794");
        assert_eq!(thousands(1_500_000), "1,500,000");
    }

    #[test]
    fn bytes_uses_decimal_units() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(306_835_452), "306.8 MB");
    }

    #[test]
    fn table_aligns_columns() {
        let mut t = Table::new("T", &["client", "rpcs"]);
        t.row(vec!["naive".into(), "73,794".into()]);
        t.row(vec!["ours".into(), "3".into()]);
        let s = t.to_string();
        assert!(s.contains("naive   73,794"), "{s}");
        assert!(s.contains("ours         3"), "{s}");
    }
}
