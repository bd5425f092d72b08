//! A hand-written SVG plot: stacked panels of a per-bin count series (no plotting crate).

use std::fmt::Write as _;
use std::time::Duration;

const WIDTH: f64 = 900.0;
const PANEL_H: f64 = 110.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const GAP: f64 = 34.0;

/// One panel per `(name, counts)`, each a filled step line of counts per `bin` over the first
/// `span`, scaled to its own peak (labelled), with a shared time axis in seconds.
pub fn histogram_panels(
    title: &str,
    series: &[(&str, &[u64])],
    bin: Duration,
    span: Duration,
) -> String {
    panels(title, series, bin, span, "per 10 ms")
}

/// As [`histogram_panels`], each panel's peak labelled with `unit` (what a bin's value is).
pub fn panels(
    title: &str,
    series: &[(&str, &[u64])],
    bin: Duration,
    span: Duration,
    unit: &str,
) -> String {
    let bins = (span.as_nanos() / bin.as_nanos().max(1)) as usize;
    let plot_w = WIDTH - LEFT - RIGHT;
    let height = TOP + series.len() as f64 * (PANEL_H + GAP) + 20.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
        WIDTH / 2.0,
        escape(title)
    );
    let secs = span.as_secs_f64();
    for (i, (name, counts)) in series.iter().enumerate() {
        let y0 = TOP + i as f64 * (PANEL_H + GAP);
        let base = y0 + PANEL_H;
        let peak = counts.iter().take(bins).copied().max().unwrap_or(0).max(1);
        let _ = writeln!(
            s,
            r##"<rect x="{LEFT}" y="{y0}" width="{plot_w}" height="{PANEL_H}" fill="#f7f7f7" stroke="#999"/>"##
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}">{} (peak {} {})</text>"#,
            LEFT + 6.0,
            y0 + 15.0,
            escape(name),
            peak,
            escape(unit)
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{peak}</text>"#,
            LEFT - 6.0,
            y0 + 10.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">0</text>"#,
            LEFT - 6.0,
            base
        );
        // A step line; runs of equal counts collapse into one horizontal segment.
        let mut d = format!("M{LEFT:.1},{base:.1}");
        let mut prev = None;
        for b in 0..bins {
            let c = counts.get(b).copied().unwrap_or(0);
            if prev == Some(c) {
                continue;
            }
            let x0 = LEFT + plot_w * b as f64 / bins as f64;
            let y_prev = base - PANEL_H * prev.unwrap_or(0) as f64 / peak as f64;
            let y = base - PANEL_H * c as f64 / peak as f64;
            let _ = write!(d, " L{x0:.1},{y_prev:.1} L{x0:.1},{y:.1}");
            prev = Some(c);
        }
        let y_last = base - PANEL_H * prev.unwrap_or(0) as f64 / peak as f64;
        let _ = write!(d, " L{:.1},{y_last:.1}", LEFT + plot_w);
        let _ = write!(d, " L{:.1},{base:.1} Z", LEFT + plot_w);
        let _ = writeln!(
            s,
            r##"<path d="{d}" fill="#4c78a8" fill-opacity="0.6" stroke="#1f4e79" stroke-width="0.6"/>"##
        );
        // Time ticks every 5 s.
        let step = if secs > 60.0 { 10.0 } else { 5.0 };
        let mut t = 0.0;
        while t <= secs + 1e-9 {
            let x = LEFT + plot_w * t / secs;
            let _ = writeln!(
                s,
                r##"<line x1="{x:.1}" y1="{base}" x2="{x:.1}" y2="{}" stroke="#666"/>"##,
                base + 4.0
            );
            let _ = writeln!(
                s,
                r#"<text x="{x:.1}" y="{}" text-anchor="middle">{t:.0} s</text>"#,
                base + 16.0
            );
            t += step;
        }
    }
    s.push_str("</svg>\n");
    s
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svg_has_one_path_per_series_and_escapes_names() {
        let a = [1u64, 5, 2];
        let b = [0u64, 0, 9];
        let svg = histogram_panels(
            "t",
            &[("a<b", &a), ("c", &b)],
            Duration::from_millis(10),
            Duration::from_millis(30),
        );
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<path").count(), 2);
        assert!(svg.contains("a&lt;b (peak 5 per 10 ms)"));
        assert!(svg.contains("c (peak 9 per 10 ms)"));
    }
}
