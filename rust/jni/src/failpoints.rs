//! `NativeBridge.configureFailPoints`: test-only fault injection into the
//! core's protocol points (cargo feature `failpoints`).
//!
//! The spec is `name=actions;name=actions` in the fail crate's syntax, e.g.
//! `twopc-commit-after=1*return` or `twopc-write=panic(boom)`;
//! `name=off` disables one point, and an empty spec or `off` removes them
//! all. Points are process-wide for this copy of the library.

use crate::error::{BridgeError, BridgeResult};

#[cfg(feature = "failpoints")]
pub(crate) fn configure(spec: &str) -> BridgeResult<()> {
    let spec = spec.trim();
    if spec.is_empty() || spec == "off" {
        for (name, _) in fail::list() {
            fail::remove(name);
        }
        log::info!(target: "twopc::jni", "fail points cleared");
        return Ok(());
    }
    // Parse everything first so that a typo in the third entry does not
    // leave the first two applied.
    let entries = parse(spec)?;
    for (name, actions) in entries {
        fail::cfg(name, actions).map_err(|e| {
            BridgeError::illegal_argument(format!("fail point {name}={actions}: {e}"))
        })?;
        log::info!(target: "twopc::jni", "fail point {name} set to {actions}");
    }
    Ok(())
}

#[cfg(not(feature = "failpoints"))]
pub(crate) fn configure(_spec: &str) -> BridgeResult<()> {
    Err(BridgeError::illegal_state(
        "the twopc native library was built without fail points (cargo feature `failpoints`, \
         set TWOPC_CARGO_FEATURES=failpoints when building); configureFailPoints is for tests only",
    ))
}

/// Splits `name=actions;...` into pairs.
#[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
fn parse(spec: &str) -> BridgeResult<Vec<(&str, &str)>> {
    spec.split(';')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(|entry| {
            let (name, actions) = entry.split_once('=').ok_or_else(|| {
                BridgeError::illegal_argument(format!(
                    "fail point entry {entry:?} is not of the form name=actions"
                ))
            })?;
            let (name, actions) = (name.trim(), actions.trim());
            if name.is_empty() || actions.is_empty() {
                return Err(BridgeError::illegal_argument(format!(
                    "fail point entry {entry:?} has an empty name or action"
                )));
            }
            Ok((name, actions))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_entries() {
        let got = parse(" twopc-write=return ; twopc-commit-after=1*panic(x) ;").unwrap();
        assert_eq!(
            got,
            vec![
                ("twopc-write", "return"),
                ("twopc-commit-after", "1*panic(x)")
            ]
        );
        assert!(parse("twopc-write").is_err());
        assert!(parse("=return").is_err());
        assert!(parse("twopc-write=").is_err());
    }
}
