//! Command-line arguments, split the way every `twopc` command reads them:
//! positionals, `--flag`, `--flag value`, `--flag=value`, and `--` to end
//! the options.

use std::ffi::OsString;

pub struct Args {
    items: std::vec::IntoIter<OsString>,
    only_positional: bool,
}

/// An option as given: its name and a value written inline (`--x=v`).
pub struct Flag {
    pub name: String,
    inline: Option<String>,
}

impl Args {
    pub fn new(args: Vec<OsString>) -> Self {
        Args {
            items: args.into_iter(),
            only_positional: false,
        }
    }

    /// The next positional (`Ok`) or option (`Err`), or `None` at the end.
    #[allow(clippy::type_complexity)]
    pub fn next_item(&mut self) -> Result<Option<Result<String, Flag>>, String> {
        loop {
            let Some(arg) = self.items.next() else {
                return Ok(None);
            };
            let text = arg
                .into_string()
                .map_err(|a| format!("argument {a:?} is not valid UTF-8"))?;
            if self.only_positional || !(text.starts_with('-') && text.len() > 1) {
                return Ok(Some(Ok(text)));
            }
            if text == "--" {
                self.only_positional = true;
                continue;
            }
            let flag = match text.split_once('=') {
                Some((f, v)) if f.starts_with("--") => Flag {
                    name: f.to_string(),
                    inline: Some(v.to_string()),
                },
                _ => Flag {
                    name: text,
                    inline: None,
                },
            };
            return Ok(Some(Err(flag)));
        }
    }

    /// The value of `flag`: inline, or the next argument.
    pub fn value(&mut self, flag: &Flag) -> Result<String, String> {
        if let Some(v) = &flag.inline {
            return Ok(v.clone());
        }
        match self.items.next() {
            Some(v) => v
                .into_string()
                .map_err(|v| format!("{} value {v:?} is not valid UTF-8", flag.name)),
            None => Err(format!("{} needs a value", flag.name)),
        }
    }
}
