//! Two builds compared in one run (`--baseline-sexton`): a sexton method run by the earlier
//! build ("before") and by this one ("after") alternately, pair by pair, each run on its own
//! identical copy; the ratio of each pair, and their spread, which is the noise the ratio is
//! read against.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::cli::Cli;
use crate::table::{Column, columns, f, flat, or_dash};

/// What one run of a method gave, as a comparison counts it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Side {
    pub seconds: f64,
    /// What it removed or examined per second, in the comparison's unit.
    pub rate: f64,
    pub peak_rss_kb: Option<u64>,
    /// The application writer's longest lock wait beside it, where one runs.
    pub writer_wait_ms: Option<f64>,
}

/// One pair: the two builds on identical copies, one right after the other.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Pair {
    /// Whether the after build ran first (the order alternates from pair to pair).
    pub after_first: bool,
    pub before: Side,
    pub after: Side,
}

impl Pair {
    /// The after build's rate over the before build's: above 1 it is faster.
    pub fn ratio(&self) -> f64 {
        self.after.rate / self.before.rate
    }
}

/// One method compared, pair by pair.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Comparison {
    /// The part, and the method at its size: `scales`, `10 · sexton`.
    pub part: String,
    pub case: String,
    /// What the rates count.
    pub unit: String,
    pub pairs: Vec<Pair>,
}

impl Comparison {
    /// The median over the pairs of `figure`.
    fn median(&self, figure: fn(&Pair) -> f64) -> f64 {
        let mut values: Vec<f64> = self.pairs.iter().map(figure).collect();
        values.sort_by(f64::total_cmp);
        match values.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => values[n / 2],
            n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
        }
    }

    /// The lowest and the highest of `figure` over the pairs.
    fn extremes(&self, figure: fn(&Pair) -> f64) -> (f64, f64) {
        let values = self.pairs.iter().map(figure);
        values.fold((f64::INFINITY, f64::NEG_INFINITY), |(low, high), v| {
            (low.min(v), high.max(v))
        })
    }

    /// Half the range of the before build's rates over its runs, as a share of their median:
    /// the noise of one run.
    fn before_spread(&self) -> f64 {
        let (low, high) = self.extremes(|p| p.before.rate);
        (high - low) / 2.0 / self.median(|p| p.before.rate)
    }

    /// In how many of the pairs the after build was faster: a sign test, which tells a change
    /// from the noise only when every one of enough pairs agrees (all five of five by chance
    /// one time in 32 each way).
    fn faster_in(&self) -> String {
        let faster = self.pairs.iter().filter(|p| p.ratio() > 1.0).count();
        format!("{faster} of {}", self.pairs.len())
    }

    /// The largest of one build's `figure` over the pairs, shown by `show`, or "—".
    fn largest<T: PartialOrd + Copy>(
        &self,
        figure: fn(&Pair) -> Option<T>,
        show: fn(T) -> String,
    ) -> String {
        let values = self.pairs.iter().filter_map(figure);
        or_dash(values.reduce(|a, b| if b > a { b } else { a }), show)
    }
}

/// One of the two builds: its binary, and its name in the figures (`baseline` for the earlier
/// one, `sexton` for this one).
#[derive(Clone, Copy)]
pub struct Build<'a> {
    pub binary: &'a Path,
    pub code: &'static str,
}

/// Method `case` of `part` by both builds, `--pairs` times, when `--baseline-sexton` names the
/// earlier one: `run` measures one run of the build it is given on a copy of its own. Pairs
/// alternate which build goes first, so that a drift over the run (a cache filling, a disk
/// ageing) falls on both alike. `None` without an earlier build.
pub async fn pairs(
    cli: &Cli,
    part: &str,
    case: String,
    unit: &str,
    mut run: impl AsyncFnMut(Build<'_>) -> anyhow::Result<Side>,
) -> anyhow::Result<Option<Comparison>> {
    let Some(baseline) = &cli.baseline_sexton else {
        return Ok(None);
    };
    let before = Build {
        binary: baseline,
        code: "baseline",
    };
    let after = Build {
        binary: &cli.sexton,
        code: "sexton",
    };
    let mut pairs = Vec::new();
    for n in 0..cli.pairs {
        let after_first = n % 2 == 1;
        eprintln!("{part} {case}: pair {} of {}", n + 1, cli.pairs);
        let (before, after) = if after_first {
            let after = run(after).await?;
            (run(before).await?, after)
        } else {
            let before = run(before).await?;
            (before, run(after).await?)
        };
        pairs.push(Pair {
            after_first,
            before,
            after,
        });
    }
    Ok(Some(Comparison {
        part: part.to_owned(),
        case,
        unit: unit.to_owned(),
        pairs,
    }))
}

/// The comparisons' table: a row per method, its pairs' median ratio and range against the
/// before build's own spread from run to run.
pub fn markdown(comparisons: &[Comparison]) -> String {
    columns(COLUMNS, &flat(comparisons))
}

/// The columns of [`markdown`] (docs/benchmark.md says what each is).
const COLUMNS: &[Column<(), Comparison>] = &[
    ("part", |_, c| c.part.clone()),
    ("case", |_, c| c.case.clone()),
    ("pairs", |_, c| c.pairs.len().to_string()),
    ("before s", |_, c| f(c.median(|p| p.before.seconds), 2)),
    ("after s", |_, c| f(c.median(|p| p.after.seconds), 2)),
    ("after ÷ before", |_, c| {
        format!("{:.2}× ({})", c.median(Pair::ratio), c.unit)
    }),
    ("range", |_, c| {
        let (low, high) = c.extremes(Pair::ratio);
        format!("{low:.2}–{high:.2}×")
    }),
    ("before's spread", |_, c| {
        format!("±{:.0}%", 100.0 * c.before_spread())
    }),
    ("peak RSS MB before / after", |_, c| {
        let mb = |kb: u64| f(kb as f64 / 1024.0, 1);
        let before = c.largest(|p| p.before.peak_rss_kb, mb);
        format!("{before} / {}", c.largest(|p| p.after.peak_rss_kb, mb))
    }),
    ("writer's longest wait ms before / after", |_, c| {
        let ms = |ms: f64| f(ms, 1);
        let before = c.largest(|p| p.before.writer_wait_ms, ms);
        format!("{before} / {}", c.largest(|p| p.after.writer_wait_ms, ms))
    }),
    ("after faster in", |_, c| c.faster_in()),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn side(rate: f64) -> Side {
        Side {
            seconds: 100.0 / rate,
            rate,
            peak_rss_kb: None,
            writer_wait_ms: None,
        }
    }

    fn of(rates: &[(f64, f64)]) -> Comparison {
        let pairs = rates.iter().enumerate().map(|(n, &(before, after))| Pair {
            after_first: n % 2 == 1,
            before: side(before),
            after: side(after),
        });
        Comparison {
            part: "scales".to_owned(),
            case: "10 · sexton".to_owned(),
            unit: "owners/s".to_owned(),
            pairs: pairs.collect(),
        }
    }

    #[test]
    fn the_pairs_give_the_median_ratio_the_noise_and_how_many_were_faster() {
        let faster = of(&[(100.0, 120.0), (110.0, 121.0), (90.0, 99.0)]);
        assert_eq!(faster.faster_in(), "3 of 3");
        assert!((faster.median(Pair::ratio) - 1.1).abs() < 1e-9);
        let (low, high) = faster.extremes(Pair::ratio);
        assert!((low - 1.1).abs() < 1e-9 && (high - 1.2).abs() < 1e-9);
        // The before build's own rates, 90–110 around 100: ±10%.
        assert!((faster.before_spread() - 0.1).abs() < 1e-9);
        let mixed = of(&[(100.0, 120.0), (110.0, 100.0), (90.0, 99.0)]);
        assert_eq!(mixed.faster_in(), "2 of 3");
        let slower = of(&[(100.0, 90.0), (110.0, 100.0)]);
        assert_eq!(slower.faster_in(), "0 of 2");
    }

    #[test]
    fn the_table_has_a_row_per_comparison_with_its_median_ratio() {
        let md = markdown(&[of(&[(100.0, 120.0), (110.0, 121.0), (90.0, 99.0)])]);
        assert_eq!(md.lines().count(), 3, "{md}");
        assert!(
            md.contains("| 1.10× (owners/s) | 1.10–1.20× | ±10% |"),
            "{md}"
        );
        assert!(md.ends_with("| 3 of 3 |\n"), "{md}");
    }
}
