//! What the schedules exercised: counts per crash point, injected fault,
//! expiry, stop reason, operator action, recovery decision and final
//! outcome, printed as a table per destination.

use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Section {
    Schedules,
    CrashPoint,
    FaultInjected,
    Expiry,
    Failover,
    FatalStop,
    OperatorAction,
    Protocol,
    Outcome,
}

impl Section {
    fn title(self) -> &'static str {
        match self {
            Section::Schedules => "schedules",
            Section::CrashPoint => "crash points",
            Section::FaultInjected => "injected destination faults",
            Section::Expiry => "expiry",
            Section::Failover => "failover causes (job restarted from its latest checkpoint)",
            Section::FatalStop => "fatal stops (job stopped, operator recovered it)",
            Section::OperatorAction => "operator actions",
            Section::Protocol => "protocol decisions observed",
            Section::Outcome => "final outcome of each schedule",
        }
    }
}

#[derive(Clone, Default)]
pub struct Coverage {
    counts: BTreeMap<(Section, String), u64>,
}

impl Coverage {
    pub fn bump(&mut self, section: Section, key: impl Into<String>) {
        self.add(section, key, 1);
    }

    pub fn add(&mut self, section: Section, key: impl Into<String>, n: u64) {
        if n > 0 {
            *self.counts.entry((section, key.into())).or_default() += n;
        }
    }

    pub fn merge(&mut self, other: &Coverage) {
        for (k, v) in &other.counts {
            *self.counts.entry(k.clone()).or_default() += v;
        }
    }

    pub fn get(&self, section: Section, key: &str) -> u64 {
        self.counts
            .get(&(section, key.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// One row per key seen in any column, grouped by section.
    pub fn table(columns: &[(&str, &Coverage)]) -> String {
        let mut keys: Vec<&(Section, String)> =
            columns.iter().flat_map(|(_, c)| c.counts.keys()).collect();
        keys.sort();
        keys.dedup();
        let width = keys
            .iter()
            .map(|(_, k)| k.len())
            .max()
            .unwrap_or(10)
            .max(40)
            + 4;
        let mut out = format!("{:width$}", "");
        for (name, _) in columns {
            out.push_str(&format!("{name:>10}"));
        }
        out.push('\n');
        let mut section = None;
        for key in keys {
            if section != Some(key.0) {
                section = Some(key.0);
                out.push_str(key.0.title());
                out.push('\n');
            }
            out.push_str(&format!("  {:w$}", key.1, w = width - 2));
            for (_, c) in columns {
                out.push_str(&format!("{:>10}", c.counts.get(key).copied().unwrap_or(0)));
            }
            out.push('\n');
        }
        out
    }
}
