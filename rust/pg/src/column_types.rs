//! Whether a column's declared type (the SQL connector's, from the table's
//! DDL) can be written into the PostgreSQL column's type without the value
//! changing silently.
//!
//! Why: COPY reads each value as text in the column's type. Most mismatches
//! fail loudly there (a fraction into `integer`, a string into `numeric`,
//! an overlong `varchar`), and the sink stops naming the record. Some do
//! not: PostgreSQL rounds a fraction with more digits than the column
//! keeps, reads a timestamp without an offset in the session's time zone,
//! and drops the part of a value the column has no room for. Those pairings
//! are refused at the start, naming the column and both types.
//!
//! The declared types come from the Java side as short names:
//! `decimal:P:S`, `timestamp:P`, `timestamp_ltz:P`, `time[:P]`, `date`,
//! `double`, `float`, `tinyint`, `smallint`, `int`, `bigint`, `string`,
//! `bytes`, `boolean` and `array:<element>`. A name this module does not
//! know is not checked.

/// A PostgreSQL column's type, as `pg_attribute` and `pg_type` give it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PgColumnType {
    /// `pg_type.typname` of the column, or of its element for an array.
    pub name: String,
    pub is_array: bool,
    /// `atttypmod`: -1 when the type has no modifier.
    pub typmod: i32,
}

impl PgColumnType {
    /// Digits after the point a `timestamp`, `timestamptz` or `time`
    /// column keeps (6 without a modifier).
    fn fraction_digits(&self) -> i32 {
        if self.typmod < 0 {
            6
        } else {
            self.typmod
        }
    }

    /// A constrained `numeric`'s precision and scale (`None`: unconstrained).
    fn numeric(&self) -> Option<(i32, i32)> {
        if self.typmod < 4 {
            return None;
        }
        let t = self.typmod - 4;
        let precision = (t >> 16) & 0xffff;
        // An 11-bit signed scale since PostgreSQL 15 (negative scales);
        // the same bits before.
        let raw = t & 0x7ff;
        let scale = if raw & 0x400 != 0 { raw - 0x800 } else { raw };
        Some((precision, scale))
    }
}

/// Why writing a value declared as `declared` into `pg` would change it
/// without an error, or `None` when it would not (or cannot be judged).
pub(crate) fn silent_change(declared: &str, pg: &PgColumnType) -> Option<String> {
    match declared.strip_prefix("array:") {
        Some(element) if pg.is_array => scalar(element, pg),
        // An array into a scalar column (a json or text one) is the
        // column's to parse; a scalar into an array column fails loudly.
        Some(_) => None,
        None if pg.is_array => None,
        None => scalar(declared, pg),
    }
}

/// A declared type as Flink SQL writes it, for messages.
pub(crate) fn declared_name(declared: &str) -> String {
    if let Some(element) = declared.strip_prefix("array:") {
        return format!("ARRAY<{}>", declared_name(element));
    }
    let mut parts = declared.split(':');
    let kind = parts.next().unwrap_or_default();
    let args: Vec<&str> = parts.collect();
    let name = match kind {
        "timestamp_ltz" => "TIMESTAMP_LTZ".to_string(),
        "string" => "STRING".to_string(),
        other => other.to_uppercase(),
    };
    if args.is_empty() {
        name
    } else {
        format!("{name}({})", args.join(", "))
    }
}

/// A column type whose input takes any text as it is.
fn is_text(column: &str) -> bool {
    matches!(column, "text" | "varchar" | "bpchar" | "name" | "citext")
}

fn scalar(declared: &str, pg: &PgColumnType) -> Option<String> {
    let mut parts = declared.split(':');
    let kind = parts.next().unwrap_or_default();
    let numbers: Vec<i32> = parts.filter_map(|p| p.parse().ok()).collect();
    let number = |i: usize| numbers.get(i).copied();
    let column = pg.name.as_str();
    // Two types whose input cuts a value short without an error (found by
    // review): `"char"` keeps the first byte, `name` the first 63 bytes.
    // A BOOLEAN fits in one byte, but as its text 't' or 'f', refused as
    // for text columns.
    if column == "char" {
        return Some(
            "the PostgreSQL type \"char\" keeps only the first byte of a value's text, so \
             longer values would be cut without an error (and a BOOLEAN would be stored as 't' \
             or 'f'); make the PostgreSQL column char(1), varchar or text, or boolean for a \
             BOOLEAN"
                .into(),
        );
    }
    // `money` reads its input through the session's lc_monetary: the
    // locale's thousands separator is skipped (under de_DE, the '.' of
    // "1.50" makes 150,00) and fraction digits beyond the locale's are
    // rounded away (found by review). Integers have neither.
    if column == "money" && matches!(kind, "decimal" | "double" | "float" | "string") {
        return Some(
            "the PostgreSQL type money reads a value's text through the server's lc_monetary \
             setting: a '.' may be skipped as a thousands separator, and fraction digits beyond \
             the locale's are rounded away, without an error; make the PostgreSQL column numeric"
                .into(),
        );
    }
    if column == "name" && kind == "string" {
        return Some(
            "the PostgreSQL type name keeps at most 63 bytes, so longer strings would be cut \
             without an error; make the PostgreSQL column varchar or text"
                .into(),
        );
    }
    match kind {
        "decimal" => {
            let (p, s) = (number(0)?, number(1)?);
            match column {
                "numeric" => match pg.numeric() {
                    Some((_, scale)) if scale < s => Some(format!(
                        "PostgreSQL would round its {s} fraction digits to {scale}"
                    )),
                    _ => None,
                },
                "float4" if p > 6 => Some(format!(
                    "real keeps about 6 significant digits, so values of up to {p} digits would \
                     be rounded"
                )),
                "float8" if p > 15 => Some(format!(
                    "double precision keeps about 15 significant digits, so values of up to {p} \
                     digits would be rounded"
                )),
                _ => None,
            }
        }
        "double" | "float" => match column {
            "float4" if kind == "double" => Some(
                "real keeps about 6 significant digits, so DOUBLE values would be rounded".into(),
            ),
            "numeric" => pg.numeric().map(|(_, scale)| {
                format!("PostgreSQL would round every value to {scale} fraction digits")
            }),
            _ => None,
        },
        "bigint" | "int" | "smallint" | "tinyint" => match column {
            "numeric" => match pg.numeric() {
                Some((_, scale)) if scale < 0 => Some(format!(
                    "its scale is {scale}, so PostgreSQL would round integers to a multiple of \
                     10^{}",
                    -scale
                )),
                _ => None,
            },
            "float4" if kind == "bigint" || kind == "int" => Some(format!(
                "real holds integers exactly only up to 2^24, so larger {} values would be rounded",
                kind.to_uppercase()
            )),
            "float8" if kind == "bigint" => Some(
                "double precision holds integers exactly only up to 2^53, so larger BIGINT values \
                 would be rounded"
                    .into(),
            ),
            _ => None,
        },
        "timestamp" | "timestamp_ltz" => {
            let p = number(0).unwrap_or(6);
            let ltz = kind == "timestamp_ltz";
            match column {
                "timestamp" | "timestamptz" if pg.fraction_digits() < p => Some(format!(
                    "PostgreSQL would round its {p} fraction digits to {}",
                    pg.fraction_digits()
                )),
                "timestamptz" if !ltz => Some(
                    "a TIMESTAMP has no time zone, so PostgreSQL would read it in the session's \
                     time zone (the server's or the role's setting), and the stored instant would \
                     depend on it; declare the column TIMESTAMP_LTZ in the table (or CAST it in \
                     the query), or make the PostgreSQL column timestamp"
                        .into(),
                ),
                "timestamp" if ltz => Some(
                    "PostgreSQL would drop the instant's offset and keep its UTC wall-clock time; \
                     declare the column TIMESTAMP in the table (or CAST it in the query), or make \
                     the PostgreSQL column timestamptz"
                        .into(),
                ),
                "date" => Some("PostgreSQL would drop the time of day".into()),
                "time" | "timetz" => Some("PostgreSQL would drop the date".into()),
                _ => None,
            }
        }
        "time" => {
            // The SQL connector declares `time:3`, the milliseconds it writes
            // whatever the DDL's precision (Flink keeps them, FLINK-17224);
            // without a precision only the time zone is judged.
            let p = number(0).unwrap_or(0);
            match column {
                "time" if pg.fraction_digits() < p => Some(format!(
                    "PostgreSQL would round its {p} fraction digits to {} (Flink keeps a TIME's \
                     milliseconds whatever its declared precision, FLINK-17224: make the \
                     PostgreSQL column time(3) or finer)",
                    pg.fraction_digits()
                )),
                "timetz" => Some(
                    "a TIME has no time zone, so PostgreSQL would add the session's offset, which \
                     depends on the server's or the role's setting; make the PostgreSQL column time"
                        .into(),
                ),
                _ => None,
            }
        }
        // Text-like columns take any text: what the COPY form of these
        // types is made of would be stored instead of the value.
        "bytes" if is_text(column) => Some(
            "PostgreSQL would store the bytes' hex text (\\x...), not the bytes; make the \
             PostgreSQL column bytea"
                .into(),
        ),
        "boolean" if is_text(column) => Some(
            "PostgreSQL would store the text 't' or 'f'; make the PostgreSQL column boolean".into(),
        ),
        "string" if column == "bytea" => Some(
            "PostgreSQL would read the text as bytea input (\\x... as hex digits, backslashes as \
             escapes), not as the string's UTF-8 bytes; make the PostgreSQL column text, or \
             declare the column BYTES"
                .into(),
        ),
        "date" => match column {
            "timestamptz" => Some(
                "PostgreSQL would read the date as midnight in the session's time zone, so the \
                 stored instant would depend on the server's or the role's setting; make the \
                 PostgreSQL column date or timestamp"
                    .into(),
            ),
            _ => None,
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pg(name: &str, typmod: i32) -> PgColumnType {
        PgColumnType {
            name: name.into(),
            is_array: false,
            typmod,
        }
    }

    /// `numeric(p, s)`'s modifier, as PostgreSQL stores it.
    fn numeric(p: i32, s: i32) -> PgColumnType {
        pg("numeric", ((p << 16) | (s & 0x7ff)) + 4)
    }

    #[test]
    fn numeric_modifiers_decode_including_negative_scales() {
        assert_eq!(numeric(10, 2).numeric(), Some((10, 2)));
        assert_eq!(numeric(5, -3).numeric(), Some((5, -3)));
        assert_eq!(pg("numeric", -1).numeric(), None);
    }

    #[test]
    fn rounding_pairs_are_named_and_exact_ones_pass() {
        // DECIMAL(10,4) into numeric(10,2): rounded.
        let why = silent_change("decimal:10:4", &numeric(10, 2)).unwrap();
        assert!(why.contains("round its 4 fraction digits to 2"), "{why}");
        for exact in [
            numeric(12, 4),
            numeric(20, 6),
            pg("numeric", -1),
            pg("text", -1),
        ] {
            assert_eq!(silent_change("decimal:10:4", &exact), None, "{exact:?}");
        }
        assert!(silent_change("decimal:10:2", &pg("float4", -1)).is_some());
        assert!(silent_change("decimal:18:2", &pg("float8", -1)).is_some());
        assert_eq!(silent_change("decimal:10:2", &pg("float8", -1)), None);
        assert!(silent_change("double", &pg("float4", -1)).is_some());
        assert_eq!(silent_change("float", &pg("float4", -1)), None);
        assert!(silent_change("double", &numeric(10, 2)).is_some());
        assert_eq!(silent_change("double", &pg("numeric", -1)), None);
        assert!(silent_change("bigint", &pg("float8", -1)).is_some());
        assert!(silent_change("int", &pg("float4", -1)).is_some());
        assert_eq!(silent_change("int", &pg("float8", -1)), None);
        assert!(silent_change("bigint", &numeric(10, -2)).is_some());
        assert_eq!(silent_change("bigint", &numeric(20, 0)), None);
        assert_eq!(silent_change("smallint", &pg("float4", -1)), None);
        // A fraction into an integer column fails loudly at COPY.
        assert_eq!(silent_change("decimal:10:2", &pg("int8", -1)), None);
    }

    /// Text-like columns take the COPY form of bytes and booleans as text,
    /// and bytea reads a string as its own input syntax (found by review).
    #[test]
    fn bytes_booleans_and_strings_into_columns_that_take_their_text_are_refused() {
        for column in ["text", "varchar", "bpchar", "citext"] {
            let why = silent_change("bytes", &pg(column, -1)).unwrap();
            assert!(why.contains("make the PostgreSQL column bytea"), "{why}");
            let why = silent_change("boolean", &pg(column, -1)).unwrap();
            assert!(why.contains("'t' or 'f'"), "{why}");
            assert_eq!(silent_change("string", &pg(column, -1)), None);
        }
        let why = silent_change("string", &pg("bytea", -1)).unwrap();
        assert!(why.contains("declare the column BYTES"), "{why}");
        // "char" keeps one byte, name 63: cut short without an error.
        for declared in ["string", "int", "decimal:10:2", "timestamp:3", "boolean"] {
            let why = silent_change(declared, &pg("char", -1)).unwrap();
            assert!(why.contains("only the first byte"), "{why}");
        }
        let why = silent_change("string", &pg("name", -1)).unwrap();
        assert!(why.contains("at most 63 bytes"), "{why}");
        // money reads through lc_monetary: separators and fraction digits.
        for declared in ["decimal:10:4", "double", "float", "string"] {
            let why = silent_change(declared, &pg("money", -1)).unwrap();
            assert!(why.contains("lc_monetary"), "{why}");
        }
        for declared in ["int", "bigint"] {
            assert_eq!(
                silent_change(declared, &pg("money", -1)),
                None,
                "{declared}"
            );
        }
        assert_eq!(silent_change("int", &pg("name", -1)), None);
        assert_eq!(silent_change("bytes", &pg("bytea", -1)), None);
        assert_eq!(silent_change("boolean", &pg("bool", -1)), None);
        // Arrays are judged by their elements.
        assert!(silent_change(
            "array:bytes",
            &PgColumnType {
                name: "text".into(),
                is_array: true,
                typmod: -1
            }
        )
        .is_some());
    }

    #[test]
    fn time_zone_dependent_and_truncating_time_pairs_are_refused() {
        for (declared, column, typmod, words) in [
            ("timestamp:6", "timestamptz", -1, "session's time zone"),
            (
                "timestamp_ltz:6",
                "timestamp",
                -1,
                "drop the instant's offset",
            ),
            (
                "timestamp:6",
                "timestamp",
                0,
                "round its 6 fraction digits to 0",
            ),
            (
                "timestamp_ltz:3",
                "timestamptz",
                2,
                "round its 3 fraction digits to 2",
            ),
            ("timestamp:3", "date", -1, "drop the time of day"),
            ("timestamp:3", "time", -1, "drop the date"),
            ("time:3", "time", 0, "round its 3 fraction digits to 0"),
            (
                "time:3",
                "time",
                2,
                "make the PostgreSQL column time(3) or finer",
            ),
            ("time:0", "timetz", -1, "session's offset"),
            ("time", "timetz", -1, "session's offset"),
            (
                "date",
                "timestamptz",
                -1,
                "midnight in the session's time zone",
            ),
        ] {
            let why = silent_change(declared, &pg(column, typmod))
                .unwrap_or_else(|| panic!("{declared} into {column}({typmod}) passed"));
            assert!(why.contains(words), "{declared} into {column}: {why}");
        }
        for (declared, column, typmod) in [
            ("timestamp:6", "timestamp", -1),
            ("timestamp:3", "timestamp", 3),
            ("timestamp_ltz:6", "timestamptz", 6),
            ("timestamp:6", "text", -1),
            ("time:0", "time", 0),
            ("time", "time", 0),
            ("date", "date", -1),
            ("date", "timestamp", -1),
            ("string", "timestamptz", -1),
            ("unknown:1", "numeric", 8),
        ] {
            assert_eq!(
                silent_change(declared, &pg(column, typmod)),
                None,
                "{declared} into {column}({typmod})"
            );
        }
    }

    #[test]
    fn declared_names_read_as_flink_sql_writes_them() {
        assert_eq!(declared_name("decimal:10:4"), "DECIMAL(10, 4)");
        assert_eq!(declared_name("timestamp_ltz:3"), "TIMESTAMP_LTZ(3)");
        assert_eq!(declared_name("array:timestamp:6"), "ARRAY<TIMESTAMP(6)>");
        assert_eq!(declared_name("double"), "DOUBLE");
    }

    #[test]
    fn arrays_are_judged_by_their_elements() {
        let array = |name: &str, typmod| PgColumnType {
            is_array: true,
            ..pg(name, typmod)
        };
        assert!(silent_change("array:timestamp:6", &array("timestamptz", -1)).is_some());
        assert_eq!(
            silent_change("array:timestamp:6", &array("timestamp", -1)),
            None
        );
        assert!(
            silent_change("array:decimal:5:3", &array("numeric", ((5 << 16) | 1) + 4)).is_some()
        );
        // An array into a json or text column, a scalar into an array.
        assert_eq!(silent_change("array:double", &pg("jsonb", -1)), None);
        assert_eq!(silent_change("double", &array("float4", -1)), None);
    }
}
