//! Edits of a parsed TOML document: set, remove or duplicate the value at a path of keys and
//! array positions. A target names the paths worth visiting (its schema's keys, a few unknown
//! ones) and the edited document is written back as text, so every edit reaches the checks
//! that come after TOML's own parsing.

use proptest::prelude::*;
use proptest::sample::Index;
use toml::{Table, Value};

/// One step of a path: a key of a table, or a position in an array (of tables).
#[derive(Debug, Clone)]
pub enum Seg {
    Key(String),
    At(Index),
}

#[derive(Debug, Clone)]
pub enum Action {
    Set(Value),
    Remove,
    /// Copies the value at the path beside itself (an array element) or, for a key, copies
    /// the last element of the array there.
    Duplicate,
}

/// An edit: what to do at the end of a path. Missing tables and arrays on the way are made.
#[derive(Debug, Clone)]
pub struct Edit {
    pub path: Vec<Seg>,
    pub action: Action,
}

/// `text` parsed, edited and written back; `None` when the text is not TOML or the edited
/// document cannot be written (the target then uses the text as it is).
pub fn apply(text: &str, edits: &[Edit]) -> Option<String> {
    if edits.is_empty() {
        return Some(text.to_string());
    }
    let table: Table = toml::from_str(text).ok()?;
    let mut root = Value::Table(table);
    for edit in edits {
        apply_at(&mut root, &edit.path, &edit.action);
    }
    toml::to_string(&root).ok()
}

fn apply_at(value: &mut Value, path: &[Seg], action: &Action) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    match first {
        Seg::Key(key) => {
            if !value.is_table() {
                *value = Value::Table(Table::new());
            }
            let Value::Table(table) = value else { return };
            if rest.is_empty() {
                match action {
                    Action::Set(v) => {
                        table.insert(key.clone(), v.clone());
                    }
                    Action::Remove => {
                        table.remove(key);
                    }
                    Action::Duplicate => {
                        if let Some(Value::Array(items)) = table.get_mut(key)
                            && let Some(last) = items.last().cloned()
                        {
                            items.push(last);
                        }
                    }
                }
                return;
            }
            let child = table.entry(key.clone()).or_insert_with(|| match rest[0] {
                Seg::At(_) => Value::Array(Vec::new()),
                Seg::Key(_) => Value::Table(Table::new()),
            });
            apply_at(child, rest, action);
        }
        Seg::At(index) => {
            if !value.is_array() {
                *value = Value::Array(Vec::new());
            }
            let Value::Array(items) = value else { return };
            if items.is_empty() {
                items.push(Value::Table(Table::new()));
            }
            let n = index.index(items.len());
            if rest.is_empty() {
                match action {
                    Action::Set(v) => items[n] = v.clone(),
                    Action::Remove => {
                        items.remove(n);
                    }
                    Action::Duplicate => {
                        let copy = items[n].clone();
                        items.insert(n, copy);
                    }
                }
                return;
            }
            apply_at(&mut items[n], rest, action);
        }
    }
}

const INTS: &[i64] = &[
    i64::MIN,
    -4097,
    -1,
    0,
    1,
    2,
    3,
    100,
    101,
    4096,
    4097,
    u32::MAX as i64,
    u32::MAX as i64 + 1,
    i64::MAX,
];

const FLOATS: &[f64] = &[
    f64::NAN,
    f64::INFINITY,
    f64::NEG_INFINITY,
    -0.0,
    0.0,
    1e-300,
    0.5,
    255.0,
    1e300,
    f64::MAX,
];

/// Strings every schema is likely to choke on: sizes and durations at their edges, paths,
/// line breaks and control characters, non-ASCII.
const STRINGS: &[&str] = &[
    "",
    " ",
    "0",
    "1",
    "-1",
    "10GiB",
    "1.5GiB",
    ".5GiB",
    "1.GiB",
    "0.1B",
    "16EiB",
    "18446744073709551615",
    "18446744073709551616",
    "17179869184GiB",
    "9999999999999999TB",
    "1e3",
    "90s",
    "0s",
    "0.0001ms",
    "500ms",
    "15m",
    "3d",
    "99999999999999999999999d",
    "1.5.5m",
    "nan",
    "inf",
    "-5s",
    "mlp",
    "least-loaded",
    "x.wasm",
    "/abs/path",
    "a/b",
    "a\\b",
    "per-device",
    "single",
    "csv",
    "mnist-idx",
    "a\nb",
    "a\rb",
    "\t",
    "\u{0}",
    "é",
    "😀",
    "\u{202e}",
    "GPU-",
    "GPU-aaaaaaaa",
    "MIG-",
    "9.0",
    "9.",
    ".0",
];

/// A value for a key: mostly edge cases, some arbitrary, now and then an array or a table.
/// `extra` adds strings that matter to one schema.
pub fn value(extra: &'static [&'static str]) -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        2 => prop::sample::select(INTS).prop_map(Value::Integer),
        1 => any::<i64>().prop_map(Value::Integer),
        1 => prop::sample::select(FLOATS).prop_map(Value::Float),
        1 => any::<f64>().prop_map(Value::Float),
        3 => prop::sample::select(STRINGS).prop_map(|s| Value::String(s.to_string())),
        2 => prop::sample::select(extra).prop_map(|s| Value::String(s.to_string())),
        1 => any::<String>().prop_map(|s| Value::String(s.chars().take(24).collect())),
        2 => "[0-9]{1,22}(\\.[0-9]{0,3})?( ?(B|KiB|MiB|GiB|TiB|KB|kB|MB|GB|TB|ms|s|m|h|d))?"
            .prop_map(Value::String),
        1 => any::<bool>().prop_map(Value::Boolean),
        1 => Just("1979-05-27T07:32:00Z")
            .prop_filter_map("a datetime", |s| s.parse().ok().map(Value::Datetime)),
    ];
    leaf.prop_recursive(2, 8, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,8}", inner, 0..3)
                .prop_map(|m| Value::Table(m.into_iter().collect())),
        ]
    })
}

/// A size in bytes as a file may write it, at the edges of `u64`.
pub fn size_value() -> impl Strategy<Value = Value> {
    const SIZES: &[&str] = &[
        "0",
        "1B",
        "8GiB",
        "80GiB",
        "16384TiB",
        "16777215TiB",
        "18446744073709551615",
        "18446744073709551615B",
        "18446744073709551616",
        "18446744073709.551615MB",
        "1.5",
        "0.5KiB",
    ];
    prop_oneof![
        prop::sample::select(SIZES).prop_map(|s| Value::String(s.to_string())),
        prop::sample::select(&[0, 1, 1 << 62, i64::MAX, -1][..]).prop_map(Value::Integer),
    ]
}

/// An action: mostly setting a value from [`value`].
pub fn action(extra: &'static [&'static str]) -> impl Strategy<Value = Action> {
    prop_oneof![
        6 => value(extra).prop_map(Action::Set),
        2 => Just(Action::Remove),
        1 => Just(Action::Duplicate),
    ]
}

/// A key from `keys`, most often, or any short key.
pub fn key(keys: &'static [&'static str]) -> impl Strategy<Value = Seg> {
    prop_oneof![
        8 => prop::sample::select(keys).prop_map(|k| Seg::Key(k.to_string())),
        1 => "[a-z_]{1,10}".prop_map(Seg::Key),
    ]
}

/// An array position.
pub fn at() -> impl Strategy<Value = Seg> {
    any::<Index>().prop_map(Seg::At)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &str) -> Seg {
        Seg::Key(k.to_string())
    }

    #[test]
    fn edits_make_the_path_and_act_at_its_end() {
        let text = "[job]\nname = \"a\"\n";
        let set = Edit {
            path: vec![key("resources"), key("gpus")],
            action: Action::Set(Value::Integer(0)),
        };
        let out = apply(text, &[set]).unwrap();
        let doc: Table = toml::from_str(&out).unwrap();
        assert_eq!(doc["resources"]["gpus"].as_integer(), Some(0));
        assert_eq!(doc["job"]["name"].as_str(), Some("a"));

        let remove = Edit {
            path: vec![key("job"), key("name")],
            action: Action::Remove,
        };
        let doc: Table = toml::from_str(&apply(text, &[remove]).unwrap()).unwrap();
        assert!(doc["job"].as_table().unwrap().is_empty());
    }

    #[test]
    fn duplicate_copies_an_array_element() {
        let text = "[[gpu]]\nname = \"a\"\n";
        let dup = Edit {
            path: vec![key("gpu")],
            action: Action::Duplicate,
        };
        let doc: Table = toml::from_str(&apply(text, &[dup]).unwrap()).unwrap();
        assert_eq!(doc["gpu"].as_array().unwrap().len(), 2);
    }
}
