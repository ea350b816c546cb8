//! Numeric CSV (optionally gzip-compressed): one sample a row, one column the integer label.
//! Records are read by the `csv` crate (RFC 4180 quoting, a UTF-8 byte-order mark, CRLF line
//! ends); this module turns cells into features and labels and says which line was wrong.

use crate::{DataError, Dataset};
use flate2::read::GzDecoder;
use std::io::{BufRead, BufReader, Read};

use ::csv::{ReaderBuilder, StringRecord, Trim};
use std::path::Path;

/// How to read a CSV file.
#[derive(Debug, Clone, PartialEq)]
pub struct CsvOptions {
    /// The label column; negative counts from the end (-1 is the last column).
    pub label_column: i64,
    /// Skip the first line.
    pub header: bool,
    /// Every feature is divided by this (16 for 8x8 digits, 255 for bytes).
    pub scale: f32,
}

impl Default for CsvOptions {
    fn default() -> CsvOptions {
        CsvOptions {
            label_column: -1,
            header: false,
            scale: 1.0,
        }
    }
}

pub fn load_csv(path: &Path, options: &CsvOptions) -> Result<Dataset, DataError> {
    let file = std::fs::File::open(path).map_err(|e| DataError::Read {
        path: path.into(),
        reason: e.to_string(),
    })?;
    let mut reader = BufReader::new(file);
    let gz = reader
        .fill_buf()
        .map(|b| b.starts_with(&[0x1f, 0x8b]))
        .unwrap_or(false);
    let reader: Box<dyn BufRead> = if gz {
        Box::new(BufReader::new(GzDecoder::new(reader)))
    } else {
        Box::new(reader)
    };
    parse(path, reader, options)
}

fn parse(path: &Path, reader: impl Read, options: &CsvOptions) -> Result<Dataset, DataError> {
    let err = |line: usize, reason: String| DataError::Csv {
        path: path.into(),
        line,
        reason,
    };
    let mut features = Vec::new();
    let mut labels = Vec::new();
    let mut width: Option<usize> = None;
    let mut records = ReaderBuilder::new()
        .has_headers(options.header)
        .trim(Trim::All)
        // Rows of another width are refused below, with both widths in the message.
        .flexible(true)
        .from_reader(reader);
    let mut record = StringRecord::new();
    let mut last_line = 0;
    loop {
        match records.read_record(&mut record) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => {
                let line = e.position().map_or(last_line + 1, |p| p.line() as usize);
                return Err(err(line, csv_reason(&e)));
            }
        }
        let number = record
            .position()
            .map_or(last_line + 1, |p| p.line() as usize);
        last_line = number;
        // A line of blanks is one empty cell: skipped, as empty lines are.
        if record.len() == 1 && record[0].is_empty() {
            continue;
        }
        let cells: Vec<&str> = record.iter().collect();
        if *width.get_or_insert(cells.len()) != cells.len() {
            return Err(err(
                number,
                format!(
                    "{} columns, the first row had {}",
                    cells.len(),
                    width.unwrap_or(0)
                ),
            ));
        }
        let n = cells.len() as i64;
        let label_at = if options.label_column < 0 {
            n + options.label_column
        } else {
            options.label_column
        };
        if !(0..n).contains(&label_at) {
            return Err(err(
                number,
                format!(
                    "label column {} is outside the {n} columns",
                    options.label_column
                ),
            ));
        }
        for (c, cell) in cells.iter().enumerate() {
            if c as i64 == label_at {
                let label: u32 = cell
                    .parse()
                    .map_err(|_| err(number, format!("label \"{cell}\" is not a class number")))?;
                labels.push(label);
            } else {
                let value: f32 = cell.parse().map_err(|_| {
                    err(
                        number,
                        format!("column {} (\"{cell}\") is not a number", c + 1),
                    )
                })?;
                features.push(value / options.scale);
            }
        }
    }
    let feature_dim = width.map_or(0, |w| w - 1);
    let num_classes = labels.iter().max().map_or(0, |&m| m as usize + 1);
    Ok(Dataset {
        features,
        labels,
        feature_dim,
        sample_shape: vec![feature_dim],
        num_classes,
    })
}

/// What the `csv` crate found wrong, without its own position (the caller names file and line).
fn csv_reason(e: &::csv::Error) -> String {
    match e.kind() {
        ::csv::ErrorKind::Io(io) => format!("cannot read it: {io}"),
        ::csv::ErrorKind::Utf8 { err, .. } => {
            format!("column {} is not UTF-8 text", err.field() + 1)
        }
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_column_anywhere_and_errors_with_lines() {
        let text = "a,b,label\n1,2,3\n4,5,0\n";
        let opts = CsvOptions {
            label_column: 2,
            header: true,
            scale: 2.0,
        };
        let d = parse(Path::new("x.csv"), text.as_bytes(), &opts).unwrap();
        assert_eq!(
            (d.features, d.labels, d.feature_dim, d.num_classes),
            (vec![0.5, 1.0, 2.0, 2.5], vec![3, 0], 2, 4)
        );
        let first = CsvOptions {
            label_column: 0,
            ..CsvOptions::default()
        };
        let d = parse(Path::new("x.csv"), "7,1,2\n".as_bytes(), &first).unwrap();
        assert_eq!(d.labels, vec![7]);
        let err = parse(
            Path::new("x.csv"),
            "1,2\n1,x\n".as_bytes(),
            &CsvOptions::default(),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "x.csv:2: label \"x\" is not a class number"
        );
        let err = parse(
            Path::new("x.csv"),
            "1,2\n1,2,3\n".as_bytes(),
            &CsvOptions::default(),
        )
        .unwrap_err();
        assert!(err.to_string().starts_with("x.csv:2: 3 columns"));
    }

    #[test]
    fn loads_the_bundled_digits() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/digits/data/digits.csv.gz");
        let d = load_csv(
            &path,
            &CsvOptions {
                scale: 16.0,
                ..CsvOptions::default()
            },
        )
        .unwrap();
        assert_eq!((d.len(), d.feature_dim, d.num_classes), (1797, 64, 10));
        assert!(d.features.iter().all(|&x| (0.0..=1.0).contains(&x)));
    }

    #[test]
    fn quoted_cells_are_one_cell_each() {
        let opts = CsvOptions {
            header: true,
            ..CsvOptions::default()
        };
        let text = "\"x, first\",\"y \"\"second\"\"\",label\n\"1.5\", 2 ,\"3\"\r\n4,\"5\",0\n";
        let d = parse(Path::new("q.csv"), text.as_bytes(), &opts).unwrap();
        assert_eq!(
            (d.features, d.labels, d.feature_dim),
            (vec![1.5, 2.0, 4.0, 5.0], vec![3, 0], 2)
        );
        // A quoted comma does not split a cell: the row has 3 columns, the second not a number.
        let err = parse(
            Path::new("q.csv"),
            "1,2,3\n4,\"5,6\",0\n".as_bytes(),
            &CsvOptions::default(),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "q.csv:2: column 2 (\"5,6\") is not a number"
        );
        // A quoted cell over two lines: the next record's line is still right.
        let err = parse(
            Path::new("q.csv"),
            "\"1\n\",2\n3,x\n".as_bytes(),
            &CsvOptions::default(),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "q.csv:3: label \"x\" is not a class number"
        );
    }

    #[test]
    fn a_utf8_byte_order_mark_is_not_part_of_the_first_cell() {
        let plain = parse(
            Path::new("b.csv"),
            "\u{feff}1,2\n3,4\n".as_bytes(),
            &CsvOptions::default(),
        )
        .unwrap();
        assert_eq!((plain.features, plain.labels), (vec![1.0, 3.0], vec![2, 4]));
        let headed = parse(
            Path::new("b.csv"),
            "\u{feff}a,label\n1,2\n".as_bytes(),
            &CsvOptions {
                header: true,
                ..CsvOptions::default()
            },
        )
        .unwrap();
        assert_eq!(headed.labels, vec![2]);
    }

    #[test]
    fn blank_lines_are_skipped_and_bad_bytes_named_with_their_line() {
        let d = parse(
            Path::new("e.csv"),
            "1,2\n\n   \n3,4\n".as_bytes(),
            &CsvOptions::default(),
        )
        .unwrap();
        assert_eq!(d.labels, vec![2, 4]);
        let err = parse(
            Path::new("e.csv"),
            &b"1,2\n3,\xff\n"[..],
            &CsvOptions::default(),
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "e.csv:2: column 2 is not UTF-8 text");
    }
}
