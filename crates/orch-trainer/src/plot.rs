//! `plot.svg`: training loss and evaluation loss against steps on top, evaluation accuracy
//! below, drawn with `plotters`' SVG backend. Its cost, measured on a 2-core machine: a cold
//! build of plotters 0.3.7 with `svg_backend` and `line_series` (no fonts: SVG text needs no
//! glyphs, and label widths are estimated) and its 3 dependencies took 2.4 s (debug) and 3.5 s
//! (release).

use crate::error::TrainError;
use crate::report::Record;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

/// Writes `plot.svg`: training loss (thin line, averaged in buckets when there are many steps)
/// and evaluation loss (dots) on top, evaluation accuracy below, both against steps.
pub(crate) fn write_plot(path: &Path, records: &[Record], title: &str) -> Result<(), TrainError> {
    let output = |source| TrainError::Output {
        path: path.to_path_buf(),
        source,
    };
    let svg = plot(records, title).map_err(|e| output(std::io::Error::other(e)))?;
    std::fs::write(path, svg).map_err(output)
}

const SIZE: (u32, u32) = (720, 580);
const LOSS: RGBColor = RGBColor(0x1f, 0x77, 0xb4);
const EVAL: RGBColor = RGBColor(0xd6, 0x27, 0x28);
const ACCURACY: RGBColor = RGBColor(0x2c, 0xa0, 0x2c);

/// What the plot shows, read from the records.
struct Series {
    /// Steps with a finite loss.
    steps: Vec<(f64, f64)>,
    /// Steps and evaluations whose loss is NaN or infinite: marked on the top edge, not drawn
    /// as points (an SVG coordinate of NaN draws nothing and hides the rest of the line).
    not_finite: Vec<f64>,
    /// Each evaluation's step, loss and accuracy (finite ones only).
    epochs: Vec<(f64, Option<f64>, Option<f64>)>,
}

impl Series {
    fn of(records: &[Record]) -> Series {
        let finite = |v: Option<f64>| v.filter(|v| v.is_finite());
        // Evaluations have records of their own; files of older versions have them in the
        // epoch records only.
        let has_eval_records = records.iter().any(|r| matches!(r, Record::Eval { .. }));
        let mut series = Series {
            steps: Vec::new(),
            not_finite: Vec::new(),
            epochs: Vec::new(),
        };
        for r in records {
            match r {
                Record::Step { step, loss, .. } if loss.is_finite() => {
                    series.steps.push((*step as f64, f64::from(*loss)));
                }
                Record::Step { step, .. } => series.not_finite.push(*step as f64),
                Record::Epoch {
                    step,
                    eval_loss,
                    eval_accuracy,
                    ..
                } => {
                    if !has_eval_records && eval_loss.is_some_and(|l| !l.is_finite()) {
                        series.not_finite.push(*step as f64);
                    }
                    if !has_eval_records {
                        series.epochs.push((
                            *step as f64,
                            finite(*eval_loss),
                            finite(*eval_accuracy),
                        ));
                    }
                }
                Record::Eval {
                    step,
                    eval_loss,
                    eval_accuracy,
                    ..
                } => {
                    if !eval_loss.is_finite() {
                        series.not_finite.push(*step as f64);
                    }
                    series.epochs.push((
                        *step as f64,
                        finite(Some(*eval_loss)),
                        finite(*eval_accuracy),
                    ));
                }
            }
        }
        series
    }
}

type DrawResult<T> = Result<T, String>;

/// The SVG text of the plot.
pub(crate) fn plot(records: &[Record], title: &str) -> DrawResult<String> {
    let series = Series::of(records);
    let max_step = series
        .steps
        .iter()
        .map(|s| s.0)
        .chain(series.epochs.iter().map(|e| e.0))
        .chain(series.not_finite.iter().copied())
        .fold(1.0, f64::max);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let root = root
            .titled(title, ("sans-serif", 15))
            .map_err(|e| e.to_string())?;
        let (top, bottom) = root.split_vertically(SIZE.1 / 2 - 10);
        loss_panel(&top, &series, max_step)?;
        accuracy_panel(&bottom, &series, max_step)?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

fn loss_panel(area: &DrawingArea<SVGBackend, Shift>, s: &Series, max_step: f64) -> DrawResult<()> {
    let max_loss = s
        .steps
        .iter()
        .map(|p| p.1)
        .chain(s.epochs.iter().filter_map(|e| e.1))
        .fold(0.0, f64::max)
        .max(1e-6)
        * 1.05;
    // A finite loss near f64::MAX would make the axis infinite.
    let max_loss = max_loss.min(f64::MAX / 2.0);
    let mut chart = ChartBuilder::on(area)
        .margin(10)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..max_step, 0.0..max_loss)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_labels(5)
        .y_labels(5)
        .x_desc("step")
        .y_desc("loss")
        .y_label_formatter(&|v| format!("{v:.2}"))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .draw()
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(LineSeries::new(bucket_means(&s.steps, 1000), LOSS))
        .map_err(|e| e.to_string())?
        .label("training loss")
        .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], LOSS.filled()));
    chart
        .draw_series(
            s.epochs.iter().filter_map(|(step, loss, _)| {
                loss.map(|l| Circle::new((*step, l), 3, EVAL.filled()))
            }),
        )
        .map_err(|e| e.to_string())?
        .label("evaluation loss")
        .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], EVAL.filled()));
    let mark = ("sans-serif", 14).into_font().color(&EVAL);
    chart
        .draw_series(
            s.not_finite
                .iter()
                .map(|step| Text::new("\u{d7}", (*step, max_loss), mark.clone())),
        )
        .map_err(|e| e.to_string())?;
    if !s.not_finite.is_empty() {
        chart
            .draw_series(std::iter::once(Text::new(
                format!(
                    "{} losses are NaN or infinite (\u{d7} on the top edge)",
                    s.not_finite.len()
                ),
                (max_step * 0.02, max_loss * 0.08),
                ("sans-serif", 12).into_font().color(&EVAL),
            )))
            .map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK.mix(0.3))
        .draw()
        .map_err(|e| e.to_string())
}

fn accuracy_panel(
    area: &DrawingArea<SVGBackend, Shift>,
    s: &Series,
    max_step: f64,
) -> DrawResult<()> {
    // From a round number below the lowest accuracy to 100 %.
    let lowest = s.epochs.iter().filter_map(|e| e.2).fold(1.0, f64::min);
    let floor = ((lowest - 0.02) * 20.0).floor().clamp(0.0, 19.0) / 20.0;
    let mut chart = ChartBuilder::on(area)
        .margin(10)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..max_step, floor..1.0)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_labels(5)
        .y_labels(5)
        .x_desc("step")
        .y_desc("accuracy")
        .y_label_formatter(&|v| format!("{:.1}%", v * 100.0))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .draw()
        .map_err(|e| e.to_string())?;
    let points: Vec<(f64, f64)> = s
        .epochs
        .iter()
        .filter_map(|(step, _, a)| a.map(|a| (*step, a)))
        .collect();
    chart
        .draw_series(LineSeries::new(
            points.iter().copied(),
            ACCURACY.stroke_width(2),
        ))
        .map_err(|e| e.to_string())?
        .label("evaluation accuracy")
        .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], ACCURACY.filled()));
    chart
        .draw_series(points.iter().map(|&(step, a)| {
            EmptyElement::at((step, a))
                + Circle::new((0, 0), 3, ACCURACY.filled())
                + Text::new(format!("{:.2}%", a * 100.0), (-40, 8), ("sans-serif", 12))
        }))
        .map_err(|e| e.to_string())?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK.mix(0.3))
        .draw()
        .map_err(|e| e.to_string())
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
                step_seconds: None,
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
            train_seconds: None,
            scalars: Default::default(),
        });
        let svg = plot(&records, "t").unwrap();
        assert!(!svg.contains("NaN\""), "no NaN coordinate: {svg}");
        assert!(!svg.contains("inf\""), "{svg}");
        assert!(svg.contains("<polyline"), "the finite losses are drawn");
        assert!(svg.contains("2 losses are NaN or infinite"), "said: {svg}");
        assert_eq!(svg.matches('\u{d7}').count(), 3, "two marks and the note");
    }

    #[test]
    fn extreme_values_draw_without_failing() {
        let records = vec![
            Record::Step {
                step: u64::MAX,
                epoch: 1,
                loss: f32::MAX,
                samples_per_sec: 1.0,
                step_seconds: None,
                scalars: Default::default(),
            },
            Record::Epoch {
                epoch: 1,
                step: u64::MAX,
                train_loss: 1.0,
                eval_loss: Some(f64::MAX),
                eval_accuracy: Some(0.0),
                seconds: 1.0,
                train_seconds: None,
                scalars: Default::default(),
            },
        ];
        let svg = plot(&records, "t").unwrap();
        assert!(!svg.contains("NaN") && !svg.contains("inf\""), "{svg}");
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
