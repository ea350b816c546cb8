//! `plot.svg`: training loss and evaluation loss against steps on top, evaluation accuracy
//! below, written without a plotting dependency.
//!
//! Kept hand-written after measuring `plotters` 0.3.7 (`svg_backend`, `line_series`,
//! `point_series`, no default features): a cold build of it and its 3 dependencies took 2.4 s
//! (debug) and 3.5 s (release) on a 2-core machine, 6.4 s (debug) with `ab_glyph` for measured
//! label text. Build time is not what keeps this file, then: the chart is two fixed panels of
//! lines, dots and text, about 200 lines of SVG text that need no text measuring, and what matters
//! in it (non-finite losses marked, not dropped; thousands of steps averaged into buckets; the
//! accuracy axis from a round floor) is ours to write and test with or without plotters.

use crate::error::TrainError;
use crate::report::Record;
use std::path::Path;

/// Writes `plot.svg`: training loss (thin line, averaged in buckets when there are many steps)
/// and evaluation loss (dots) on top, evaluation accuracy below, both against steps.
pub(crate) fn write_plot(path: &Path, records: &[Record], title: &str) -> Result<(), TrainError> {
    let svg = plot(records, title);
    std::fs::write(path, svg).map_err(|source| TrainError::Output {
        path: path.to_path_buf(),
        source,
    })
}

const W: f64 = 720.0;
const PANEL_H: f64 = 220.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 16.0;

pub(crate) fn plot(records: &[Record], title: &str) -> String {
    let steps: Vec<(f64, f64)> = records
        .iter()
        .filter_map(|r| match r {
            Record::Step { step, loss, .. } if loss.is_finite() => {
                Some((*step as f64, f64::from(*loss)))
            }
            _ => None,
        })
        .collect();
    // Steps and evaluations whose loss is NaN or infinite: marked on the top edge, not drawn
    // as points (an SVG coordinate of NaN draws nothing and hides the rest of the line).
    let not_finite: Vec<f64> = records
        .iter()
        .filter_map(|r| match r {
            Record::Step { step, loss, .. } if !loss.is_finite() => Some(*step as f64),
            Record::Epoch {
                step,
                eval_loss: Some(l),
                ..
            } if !l.is_finite() => Some(*step as f64),
            _ => None,
        })
        .collect();
    let finite = |v: Option<f64>| v.filter(|v| v.is_finite());
    let epochs: Vec<(f64, Option<f64>, Option<f64>)> = records
        .iter()
        .filter_map(|r| match r {
            Record::Epoch {
                step,
                eval_loss,
                eval_accuracy,
                ..
            } => Some((*step as f64, finite(*eval_loss), finite(*eval_accuracy))),
            _ => None,
        })
        .collect();
    let max_step = steps
        .iter()
        .map(|s| s.0)
        .chain(epochs.iter().map(|e| e.0))
        .chain(not_finite.iter().copied())
        .fold(1.0, f64::max);
    let max_loss = steps
        .iter()
        .map(|s| s.1)
        .chain(epochs.iter().filter_map(|e| e.1))
        .fold(0.0, f64::max)
        .max(1e-6)
        * 1.05;
    let mut svg = String::new();
    let height = 40.0 + 2.0 * (PANEL_H + 50.0);
    svg.push_str(&format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{LEFT}\" y=\"22\" font-size=\"15\">{}</text>\n",
        escape(title)
    ));
    // Top panel: loss.
    let top = 40.0;
    let x = |s: f64| LEFT + (W - LEFT - RIGHT) * s / max_step;
    let y_loss = |l: f64| top + PANEL_H - PANEL_H * l / max_loss;
    axes(&mut svg, top, "loss", (0.0, max_loss), max_step, |v| {
        format!("{v:.2}")
    });
    let buckets = bucket_means(&steps, 1000);
    if !buckets.is_empty() {
        let points: Vec<String> = buckets
            .iter()
            .map(|&(s, l)| format!("{:.1},{:.1}", x(s), y_loss(l)))
            .collect();
        svg.push_str(&format!(
            "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.2\" points=\"{}\"/>\n",
            points.join(" ")
        ));
    }
    for (s, loss, _) in &epochs {
        if let Some(l) = loss {
            svg.push_str(&format!(
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3.5\" fill=\"#d62728\"/>\n",
                x(*s),
                y_loss(*l)
            ));
        }
    }
    for s in &not_finite {
        svg.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#d62728\" font-weight=\"bold\">\u{d7}</text>\n",
            x(*s),
            top + 10.0
        ));
    }
    if !not_finite.is_empty() {
        svg.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"#d62728\">{} losses are NaN or infinite (\u{d7} on the top edge)</text>\n",
            LEFT + 8.0,
            top + PANEL_H - 8.0,
            not_finite.len()
        ));
    }
    legend(
        &mut svg,
        top,
        &[("#1f77b4", "training loss"), ("#d62728", "evaluation loss")],
    );
    // Bottom panel: accuracy, from a round number below the lowest to 100 %.
    let top = 40.0 + PANEL_H + 50.0;
    let lowest = epochs.iter().filter_map(|e| e.2).fold(1.0, f64::min);
    let floor = ((lowest - 0.02) * 20.0).floor().clamp(0.0, 19.0) / 20.0;
    let y_acc = |a: f64| top + PANEL_H - PANEL_H * (a - floor) / (1.0 - floor);
    axes(&mut svg, top, "accuracy", (floor, 1.0), max_step, |v| {
        format!("{:.1}%", v * 100.0)
    });
    let acc: Vec<String> = epochs
        .iter()
        .filter_map(|(s, _, a)| a.map(|a| format!("{:.1},{:.1}", x(*s), y_acc(a))))
        .collect();
    if !acc.is_empty() {
        svg.push_str(&format!(
            "<polyline fill=\"none\" stroke=\"#2ca02c\" stroke-width=\"1.5\" points=\"{}\"/>\n",
            acc.join(" ")
        ));
        for (s, _, a) in &epochs {
            if let Some(a) = a {
                svg.push_str(&format!(
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3.5\" fill=\"#2ca02c\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{:.2}%</text>\n",
                    x(*s),
                    y_acc(*a),
                    x(*s) - 6.0,
                    y_acc(*a) + 18.0,
                    a * 100.0
                ));
            }
        }
    }
    legend(&mut svg, top, &[("#2ca02c", "evaluation accuracy")]);
    svg.push_str("</svg>\n");
    svg
}

fn axes(
    svg: &mut String,
    top: f64,
    label: &str,
    (lo, hi): (f64, f64),
    max_step: f64,
    fmt: impl Fn(f64) -> String,
) {
    let bottom = top + PANEL_H;
    svg.push_str(&format!(
        "<rect x=\"{LEFT}\" y=\"{top}\" width=\"{}\" height=\"{PANEL_H}\" fill=\"none\" stroke=\"#999\"/>\n",
        W - LEFT - RIGHT
    ));
    for i in 0..=4 {
        let v = lo + (hi - lo) * f64::from(i) / 4.0;
        let y = bottom - PANEL_H * f64::from(i) / 4.0;
        svg.push_str(&format!(
            "<line x1=\"{LEFT}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#eee\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
            W - RIGHT,
            LEFT - 6.0,
            y + 4.0,
            fmt(v)
        ));
        let s = max_step * f64::from(i) / 4.0;
        let x = LEFT + (W - LEFT - RIGHT) * f64::from(i) / 4.0;
        svg.push_str(&format!(
            "<text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{s:.0}</text>\n",
            bottom + 16.0
        ));
    }
    svg.push_str(&format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">step</text><text x=\"14\" y=\"{:.1}\" transform=\"rotate(-90 14 {:.1})\" text-anchor=\"middle\">{}</text>\n",
        LEFT + (W - LEFT - RIGHT) / 2.0,
        bottom + 32.0,
        top + PANEL_H / 2.0,
        top + PANEL_H / 2.0,
        escape(label)
    ));
}

/// A row of entries above a panel, right-aligned.
fn legend(svg: &mut String, top: f64, entries: &[(&str, &str)]) {
    let y = top - 6.0;
    let mut right = W - RIGHT;
    for (color, text) in entries.iter().rev() {
        svg.push_str(&format!(
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"10\" height=\"10\" fill=\"{color}\"/><text x=\"{:.1}\" y=\"{y:.1}\" text-anchor=\"end\">{}</text>\n",
            right - 10.0,
            y - 9.0,
            right - 14.0,
            escape(text)
        ));
        right -= 30.0 + 6.5 * text.len() as f64;
    }
}

/// At most `max` points: the means of equal buckets of consecutive points.
fn bucket_means(points: &[(f64, f64)], max: usize) -> Vec<(f64, f64)> {
    let size = points.len().div_ceil(max.max(1)).max(1);
    points
        .chunks(size)
        .map(|c| {
            let n = c.len() as f64;
            (
                c.iter().map(|p| p.0).sum::<f64>() / n,
                c.iter().map(|p| p.1).sum::<f64>() / n,
            )
        })
        .collect()
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_finite_losses_are_marked_and_the_rest_still_drawn() {
        let mut records: Vec<Record> = (1..=4)
            .map(|step| Record::Step {
                step,
                epoch: 1,
                loss: if step == 3 { f32::NAN } else { 1.0 },
                samples_per_sec: 1.0,
                scalars: Default::default(),
            })
            .collect();
        records.push(Record::Epoch {
            epoch: 1,
            step: 4,
            train_loss: f64::NAN,
            eval_loss: Some(f64::NAN),
            eval_accuracy: Some(0.5),
            seconds: 1.0,
            scalars: Default::default(),
        });
        let svg = plot(&records, "t");
        assert!(!svg.contains("NaN\""), "no NaN coordinate: {svg}");
        assert!(!svg.contains("inf\""), "{svg}");
        assert!(svg.contains("<polyline"), "the finite losses are drawn");
        assert!(svg.contains("2 losses are NaN or infinite"), "said: {svg}");
        assert_eq!(svg.matches('\u{d7}').count(), 3, "two marks and the note");
    }

    #[test]
    fn buckets_average() {
        let pts: Vec<(f64, f64)> = (0..10).map(|i| (f64::from(i), f64::from(i))).collect();
        assert_eq!(
            bucket_means(&pts, 5),
            vec![(0.5, 0.5), (2.5, 2.5), (4.5, 4.5), (6.5, 6.5), (8.5, 8.5)]
        );
        assert_eq!(bucket_means(&pts, 100).len(), 10);
    }
}
