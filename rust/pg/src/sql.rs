//! Quoting. Every identifier that comes from configuration is validated and
//! double-quoted, and the one literal built into SQL text (the gid, which
//! `PREPARE TRANSACTION` and `COMMIT PREPARED` only take as a literal) is
//! single-quoted. Everything else travels as a bind parameter.

use twopc_core::error::ConfigError;
use twopc_core::ids::TransactionId;

/// PostgreSQL truncates identifiers longer than NAMEDATALEN - 1 bytes, so a
/// longer configured name would silently name another object.
pub const MAX_IDENTIFIER_LEN: usize = 63;

/// PostgreSQL's limit for prepared-transaction identifiers (GIDSIZE - 1).
pub const MAX_GID_LEN: usize = 199;

/// Checks a configured identifier (`what` names the setting in messages).
/// Names are used exactly as written, so they are case-sensitive.
pub fn validate_ident(what: &str, name: &str) -> Result<(), ConfigError> {
    if name.is_empty() {
        return Err(ConfigError::new(format!(
            "{what} is empty; set it to a PostgreSQL name"
        )));
    }
    if name.len() > MAX_IDENTIFIER_LEN {
        return Err(ConfigError::new(format!(
            "{what} {name:?} is {} bytes long; PostgreSQL names are at most {MAX_IDENTIFIER_LEN} \
             bytes (a longer one would be truncated to another name)",
            name.len()
        )));
    }
    if let Some(c) = name.chars().find(|c| c.is_control()) {
        return Err(ConfigError::new(format!(
            "{what} {name:?} contains the control character {c:?}; remove it"
        )));
    }
    if name.trim() != name {
        return Err(ConfigError::new(format!(
            "{what} {name:?} starts or ends with white space; names are used exactly as written, \
             so remove it"
        )));
    }
    Ok(())
}

/// Double-quotes an identifier, doubling embedded quotes. Callers validate
/// first; quoting alone already makes any text a single identifier.
pub fn quote_ident(name: &str) -> String {
    let mut s = String::with_capacity(name.len() + 2);
    s.push('"');
    for c in name.chars() {
        if c == '"' {
            s.push('"');
        }
        s.push(c);
    }
    s.push('"');
    s
}

/// Single-quotes a string literal (standard_conforming_strings is on since
/// PostgreSQL 9.1, so only the quote itself needs doubling).
pub fn quote_literal(value: &str) -> String {
    let mut s = String::with_capacity(value.len() + 2);
    s.push('\'');
    for c in value.chars() {
        if c == '\'' {
            s.push('\'');
        }
        s.push(c);
    }
    s.push('\'');
    s
}

/// The gid literal of a transaction. Ids produced by the core contain only
/// `[A-Za-z0-9_.-]`; they are parsed again here so that a forged id can
/// never reach SQL text, and checked against PostgreSQL's length limit.
pub fn gid_literal(txn: &TransactionId) -> Result<String, String> {
    let s = txn.as_str();
    if TransactionId::parse(s).is_none() {
        return Err(format!(
            "{s:?} is not a twopc transaction id; refusing to use it as a gid"
        ));
    }
    if s.len() > MAX_GID_LEN {
        return Err(format!(
            "transaction id {s} is {} bytes; PostgreSQL gids are at most {MAX_GID_LEN}",
            s.len()
        ));
    }
    Ok(quote_literal(s))
}

/// A table name as configured: `table` or `schema.table`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableName {
    pub schema: Option<String>,
    pub name: String,
}

impl TableName {
    /// Splits at the one dot allowed. A dot inside a name cannot be
    /// configured: say so rather than guess which dot separates.
    pub fn parse(what: &str, s: &str) -> Result<Self, ConfigError> {
        let parts: Vec<&str> = s.split('.').collect();
        let (schema, name) = match parts.as_slice() {
            [name] => (None, *name),
            [schema, name] => (Some(*schema), *name),
            _ => {
                return Err(ConfigError::new(format!(
                    "{what} {s:?} has {} dots; write \"schema.table\" or \"table\" (names are \
                     used exactly as written, without quotes)",
                    parts.len() - 1
                )))
            }
        };
        if let Some(schema) = schema {
            validate_ident(&format!("schema of {what}"), schema)?;
        }
        validate_ident(what, name)?;
        Ok(TableName {
            schema: schema.map(str::to_string),
            name: name.to_string(),
        })
    }

    /// The quoted, possibly schema-qualified name for SQL text.
    pub fn quoted(&self) -> String {
        match &self.schema {
            Some(schema) => format!("{}.{}", quote_ident(schema), quote_ident(&self.name)),
            None => quote_ident(&self.name),
        }
    }
}

impl std::fmt::Display for TableName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.quoted())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use twopc_core::ids::SinkId;

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(quote_ident("orders"), "\"orders\"");
        assert_eq!(quote_ident("Or\"ders"), "\"Or\"\"ders\"");
        assert_eq!(quote_literal("a'b"), "'a''b'");
    }

    #[test]
    fn bad_identifiers_are_rejected() {
        assert!(validate_ident("column", "").is_err());
        assert!(validate_ident("column", "a\u{0}b").is_err());
        assert!(validate_ident("column", " a").is_err());
        assert!(validate_ident("column", &"x".repeat(64)).is_err());
        validate_ident("column", &"x".repeat(63)).unwrap();
        validate_ident("column", "Größe \"x\"").unwrap();
    }

    #[test]
    fn table_names_split_at_one_dot() {
        let t = TableName::parse("table", "sales.Orders").unwrap();
        assert_eq!(t.quoted(), "\"sales\".\"Orders\"");
        assert_eq!(TableName::parse("table", "o").unwrap().quoted(), "\"o\"");
        let e = TableName::parse("table", "a.b.c").unwrap_err();
        assert!(e.message().contains("2 dots"), "{e}");
        assert!(TableName::parse("table", ".x").is_err());
    }

    #[test]
    fn gids_come_only_from_transaction_ids() {
        let sink = SinkId::new("orders").unwrap();
        let id = TransactionId::compose(&sink, 3, 0xab, 9);
        assert_eq!(gid_literal(&id).unwrap(), "'orders.3.00000000000000ab.9'");
    }
}
