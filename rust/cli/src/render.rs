//! Human-readable rendering of an inspection [`Report`].

use std::fmt::Write;

use crate::inspect::{Finding, Report, SinkReport};
use twopc_core::timefmt::{duration, utc};

/// A left-aligned table; the last column is not padded.
struct Table {
    headers: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(headers: &[&'static str]) -> Self {
        Table {
            headers: headers.to_vec(),
            rows: Vec::new(),
        }
    }

    fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.headers.len());
        self.rows.push(cells);
    }

    fn render(&self, indent: &str, out: &mut String) {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.len()).collect();
        for r in &self.rows {
            for (w, c) in widths.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        let line = |cells: &mut dyn Iterator<Item = &str>, out: &mut String| {
            let mut s = String::from(indent);
            for (i, c) in cells.enumerate() {
                if i + 1 == widths.len() {
                    s.push_str(c);
                } else {
                    let pad = widths[i] - c.chars().count();
                    s.push_str(c);
                    s.push_str(&" ".repeat(pad + 2));
                }
            }
            out.push_str(s.trim_end());
            out.push('\n');
        };
        line(&mut self.headers.iter().copied(), out);
        for r in &self.rows {
            line(&mut r.iter().map(String::as_str), out);
        }
    }
}

pub fn text(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "Output directory: {}", report.output_dir);
    let _ = writeln!(
        out,
        "Scanned at {}; staged-transaction retention {} ({} ms)",
        utc(report.scanned_at_ms),
        duration(report.retention_ms),
        report.retention_ms
    );
    if report.sinks.is_empty() {
        out.push_str("\nNo sinks found.\n");
    }
    for s in &report.sinks {
        sink(report, s, &mut out);
    }

    if !report.unreferenced_files.is_empty() {
        let _ = writeln!(
            out,
            "\nVisible files no commit record references ({})",
            report.unreferenced_files.len()
        );
        let mut t = Table::new(&["FILE", "BYTES"]);
        for f in &report.unreferenced_files {
            t.row(vec![f.file.clone(), f.bytes.to_string()]);
        }
        t.render("  ", &mut out);
    }

    if !report.notes.is_empty() {
        let _ = writeln!(out, "\nNotes ({})", report.notes.len());
        findings(&report.notes, &mut out);
    }
    if report.attention.is_empty() {
        out.push_str("\nNothing needs attention.\n");
    } else {
        let _ = writeln!(out, "\nNeeds attention ({})", report.attention.len());
        findings(&report.attention, &mut out);
    }
    out
}

fn sink(report: &Report, s: &SinkReport, out: &mut String) {
    let prepared = s.staged.iter().filter(|t| t.state == "prepared").count();
    let _ = writeln!(
        out,
        "\nSink '{}': {} committed ({} records), {} prepared, {} open, {} expired",
        s.sink,
        s.committed_total,
        s.committed_records,
        prepared,
        s.staged.len() - prepared,
        s.expired.len()
    );
    if let Some(t) = &s.target {
        let _ = writeln!(
            out,
            "  Target table {}, {} (as the sink recorded it on {})",
            t.table,
            match &t.transaction_id_column {
                Some(c) => format!("transaction-id column {c}"),
                None => "no transaction-id column".to_string(),
            },
            utc(t.recorded_at_ms)
        );
    }
    if !s.lineages.is_empty() {
        out.push_str("\n  Committed output by lineage and run\n");
        let mut t = Table::new(&["LINEAGE", "RUN", "TRANSACTIONS", "RECORDS", "CHECKPOINTS"]);
        for l in &s.lineages {
            for r in &l.runs {
                t.row(vec![
                    l.lineage.clone(),
                    r.run.clone(),
                    r.transactions.to_string(),
                    r.records.to_string(),
                    format!("{} to {}", r.first_checkpoint, r.last_checkpoint),
                ]);
            }
        }
        t.render("    ", out);
    }

    if !s.committed.is_empty() {
        if s.committed.len() < s.committed_total {
            let _ = writeln!(
                out,
                "\n  Committed transactions: the latest {} of {} (--limit N or --all to list more)",
                s.committed.len(),
                s.committed_total
            );
        } else {
            out.push_str("\n  Committed transactions\n");
        }
        let mut t = Table::new(&[
            "CHECKPOINT",
            "LINEAGE",
            "SUBTASK",
            "RECORDS",
            "BYTES",
            "COMMITTED AT",
            "TRANSACTION",
            "FILE",
        ]);
        for c in &s.committed {
            let file = match (&c.file, c.file_present) {
                (Some(f), true) => f.clone(),
                (Some(f), false) => format!("{f} (MISSING)"),
                (None, _) => "-".to_string(),
            };
            t.row(vec![
                c.checkpoint.to_string(),
                c.lineage.clone(),
                c.subtask.to_string(),
                c.records.to_string(),
                c.bytes.to_string(),
                utc(c.committed_at_ms),
                c.transaction.clone(),
                file,
            ]);
        }
        t.render("    ", out);
    }

    if !s.staged.is_empty() {
        out.push_str("\n  Staged transactions\n");
        let mut t = Table::new(&[
            "TRANSACTION",
            "STATE",
            "CHECKPOINT",
            "RECORDS",
            "RUN",
            "AGE",
            "RETENTION",
        ]);
        for st in &s.staged {
            let state = if st.commit_decided {
                "prepared, commit decided".to_string()
            } else {
                st.state.to_string()
            };
            let retention = if st.within_retention {
                format!(
                    "within ({} left)",
                    duration(report.retention_ms.saturating_sub(st.age_ms))
                )
            } else {
                "PAST".to_string()
            };
            t.row(vec![
                st.transaction.clone(),
                state,
                opt(st.checkpoint),
                opt(st.records),
                st.run.clone().unwrap_or_else(|| "-".to_string()),
                duration(st.age_ms),
                retention,
            ]);
        }
        t.render("    ", out);
    }

    if !s.expired.is_empty() {
        out.push_str("\n  Expired by retention cleanup (tombstones)\n");
        let mut t = Table::new(&["TRANSACTION", "EXPIRED AT"]);
        for e in &s.expired {
            t.row(vec![e.transaction.clone(), utc(e.expired_at_ms)]);
        }
        t.render("    ", out);
    }

    if s.operations_total > 0 {
        let _ = writeln!(
            out,
            "\n  Changes made by hand: {}{}",
            s.operations_total,
            if s.operations.len() < s.operations_total {
                format!(", the latest {}", s.operations.len())
            } else {
                String::new()
            }
        );
        let mut t = Table::new(&["AT", "COMMAND", "TRANSACTION", "WHAT", "BY"]);
        for o in &s.operations {
            t.row(vec![
                utc(o.at_ms),
                o.command.clone(),
                o.transaction.clone().unwrap_or_else(|| "-".to_string()),
                o.what.clone(),
                o.by.clone(),
            ]);
        }
        t.render("    ", out);
    }

    if !s.problems.is_empty() {
        out.push_str("\n  Problems\n");
        for p in &s.problems {
            let _ = writeln!(out, "    - {p}");
        }
    }
}

fn opt(v: Option<u64>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "-".to_string())
}

fn findings(list: &[Finding], out: &mut String) {
    for (i, f) in list.iter().enumerate() {
        let scope = match &f.sink {
            Some(s) => format!(" sink '{s}':"),
            None => String::new(),
        };
        let _ = writeln!(out, "  {}. [{}]{scope} {}", i + 1, f.kind, f.message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_and_do_not_trail_spaces() {
        let mut t = Table::new(&["A", "LONGER", "LAST"]);
        t.row(vec!["wide cell".into(), "x".into(), "".into()]);
        let mut s = String::new();
        t.render("  ", &mut s);
        assert_eq!(s, "  A          LONGER  LAST\n  wide cell  x\n");
    }
}
