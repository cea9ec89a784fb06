//! Reading settings (OP-2): the pieces every section of configuration uses, the worker's own and
//! each job's. A leaf is read as [`Raw`], so that a value of the wrong type is reported rather
//! than refused by serde, and [`Check`] turns leaves into typed values while collecting every
//! [`Problem`] at once.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use serde::de::DeserializeOwned;

/// One invalid setting: which, and what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub setting: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.setting, self.message)
    }
}

/// A leaf as given: either of the expected type or anything else, kept to be reported.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Raw<T> {
    Typed(T),
    Other(serde_json::Value),
}

/// How a value that is not of the expected type is shown in a problem.
pub fn shown(value: &serde_json::Value) -> String {
    value.to_string()
}

/// Collects problems while turning raw leaves into typed values.
pub struct Check<'a> {
    problems: &'a mut Vec<Problem>,
}

impl<'a> Check<'a> {
    pub fn new(problems: &'a mut Vec<Problem>) -> Self {
        Self { problems }
    }

    /// Records that `setting` is not of the `expected` form.
    pub fn fail(&mut self, setting: &str, expected: &str, got: impl fmt::Display) {
        self.push(Problem {
            setting: setting.to_owned(),
            message: format!("expected {expected}, got {got}"),
        });
    }

    /// Records a problem once: job kinds that share a section each read all of it.
    fn push(&mut self, problem: Problem) {
        if !self.problems.contains(&problem) {
            self.problems.push(problem);
        }
    }

    /// A section's fields, read into the raw struct `T` (whose leaves are [`Raw`]); a missing or
    /// unknown field is reported against `section`.
    pub fn section<T: DeserializeOwned>(
        &mut self,
        section: &str,
        value: &serde_json::Value,
    ) -> Option<T> {
        match serde_json::from_value(value.clone()) {
            Ok(raw) => Some(raw),
            Err(err) => {
                self.push(Problem {
                    setting: section.to_owned(),
                    message: err.to_string(),
                });
                None
            }
        }
    }

    /// An integer within `range`.
    pub fn int<T: TryFrom<i64>>(
        &mut self,
        setting: &str,
        raw: &Raw<i64>,
        range: std::ops::RangeInclusive<i64>,
        expected: &str,
    ) -> Option<T> {
        match raw {
            Raw::Typed(v) if range.contains(v) => T::try_from(*v).ok(),
            Raw::Typed(v) => {
                self.fail(setting, expected, v);
                None
            }
            Raw::Other(v) => {
                self.fail(setting, expected, shown(v));
                None
            }
        }
    }

    /// A positive number of milliseconds, at most one day.
    pub fn millis(&mut self, setting: &str, raw: &Raw<i64>) -> Option<Duration> {
        self.int(
            setting,
            raw,
            1..=86_400_000,
            "a positive number of milliseconds (at most one day)",
        )
        .map(Duration::from_millis)
    }

    /// How many candidates a hop reads at once: from 1 to 100,000.
    pub fn window_size(&mut self, setting: &str, raw: &Raw<i64>) -> Option<u32> {
        self.int(setting, raw, 1..=100_000, "an integer from 1 to 100000")
    }

    /// `queue.finished_job_retention_days` (FL-7): how long finished queue jobs and the pass
    /// ledger are kept. The worker reads it (the catch-up bound, the ledger) and so does the
    /// queue's own retention job.
    pub fn finished_job_retention(&mut self, raw: &Raw<i64>) -> Option<chrono::Duration> {
        self.int::<i64>(
            "queue.finished_job_retention_days",
            raw,
            1..=3650,
            "a number of days from 1 to 3650",
        )
        .map(chrono::Duration::days)
    }

    /// A string that `parse` accepts.
    pub fn parsed<T>(
        &mut self,
        setting: &str,
        raw: &Raw<String>,
        expected: &str,
        parse: impl FnOnce(&str) -> Option<T>,
    ) -> Option<T> {
        match raw {
            Raw::Typed(s) => match parse(s) {
                Some(v) => Some(v),
                None => {
                    self.fail(setting, expected, format!("{s:?}"));
                    None
                }
            },
            Raw::Other(v) => {
                self.fail(setting, expected, shown(v));
                None
            }
        }
    }

    /// `true` or `false`.
    pub fn flag(&mut self, setting: &str, raw: &Raw<bool>) -> Option<bool> {
        match raw {
            Raw::Typed(b) => Some(*b),
            Raw::Other(v) => {
                self.fail(setting, "true or false", shown(v));
                None
            }
        }
    }

    /// A string, empty for none.
    pub fn text(&mut self, setting: &str, raw: &Raw<String>) -> Option<Option<String>> {
        self.parsed(setting, raw, "a string", |s| {
            Some((!s.trim().is_empty()).then(|| s.to_owned()))
        })
    }

    /// A non-empty path.
    pub fn path(&mut self, setting: &str, raw: &Raw<String>) -> Option<PathBuf> {
        self.parsed(setting, raw, "a non-empty path", |s| {
            (!s.trim().is_empty()).then(|| PathBuf::from(s))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Section {
        size: Raw<i64>,
    }

    #[test]
    fn op2_wrong_types_and_ranges_are_reported_with_what_was_given() {
        let mut problems = Vec::new();
        let mut check = Check::new(&mut problems);
        let section: Section = check
            .section("s", &serde_json::json!({"size": "lots"}))
            .unwrap();
        assert_eq!(
            check.int::<u32>("s.size", &section.size, 1..=9, "1-9"),
            None
        );
        let unknown = check.section::<Section>("s", &serde_json::json!({"size": 1, "bogus": 2}));
        assert!(unknown.is_none());
        assert_eq!(
            problems[0].to_string(),
            "s.size: expected 1-9, got \"lots\""
        );
        assert!(problems[1].message.contains("bogus"), "{}", problems[1]);
    }
}
