//! What the docs, `config/default.toml` and the alert rules repeat from the code, rendered from
//! the code (`sexton generate`) rather than read back out of their prose: the pool a worker needs
//! (FL-6), the subjects `sexton explain` knows (OP-1), the kinds the missed-pass alert leaves
//! out because they do not run with the nightly slot (OP-5), and how long before an erasure
//! request's due date its alert warns (`[erasure] warn_days`, RQ-7).
//!
//! Each fact sits in a marked block of its file — `<!-- generated: NAME -->` … `<!-- end
//! generated -->` in Markdown (inline within a sentence, or on lines of their own around a
//! block), `# generated: NAME` … `# end generated` lines in TOML and YAML — and the sentences
//! around it are written by hand. `sexton generate` rewrites every block from the registry under
//! the built-in defaults; `--check`, and the tests named after each rule, fail on one that is out
//! of date.

use std::collections::BTreeSet;
use std::ops::Range;
use std::path::{Path, PathBuf};

use sexton_jobs::erasure::{Erase, ErasureSettings};
use sexton_jobs::job::{Cadence, Job as _};

use crate::config::{CONNECTIONS_PER_QUEUE, ConfigError, FIXED_CONNECTIONS, PoolBudget, Settings};
use crate::explain;
use crate::registry::{self, KINDS};

/// The command that rewrites every block, run from the repository's root.
pub const COMMAND: &str = "cargo run -- generate";

/// Hours without a successful pass after which a nightly kind's pass is missed: a night and two
/// hours' slack (`SextonNoSuccessfulPass`).
const MISSED_PASS_HOURS: u32 = 26;

/// The width comments are wrapped at, as the hand-written ones around them are.
const WIDTH: usize = 100;

/// One generated block: the file it lives in, its name there, and what it says.
struct Block {
    file: &'static str,
    name: &'static str,
    render: fn(&Facts) -> String,
}

/// Every generated block; a file holds each of its own exactly once, and no other.
const BLOCKS: &[Block] = &[
    Block {
        file: "config/default.toml",
        name: "pool-budget",
        render: pool_budget_comment,
    },
    Block {
        file: "docs/operating.md",
        name: "pool-budget",
        render: pool_budget_sentence,
    },
    Block {
        file: "docs/jobs.md",
        name: "explain-subjects",
        render: explain_subjects,
    },
    Block {
        file: "deploy/prometheus/alerts.yml",
        name: "kinds-not-nightly",
        render: missed_pass_expr,
    },
    Block {
        file: "deploy/prometheus/alerts.yml",
        name: "erasure-warn-days",
        render: erasure_due_expr,
    },
];

/// What the blocks are rendered from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    /// The pool a worker needs at the configured `queue.concurrency` (FL-6).
    pub budget: PoolBudget,
    /// `database.max_connections`.
    pub max_connections: u32,
    /// The kinds whose hop holds the most connections ([`PoolBudget::per_hop`]).
    pub widest: Vec<&'static str>,
    /// Every subject `sexton explain` knows, in the registry's order, with the form of its id
    /// where that is not the one most subjects take.
    pub subjects: Vec<(&'static str, Option<String>)>,
    /// The kinds whose passes do not start with the nightly slot: a cadence of their own, or off.
    pub not_nightly: Vec<&'static str>,
    /// How many days before an open erasure request's due date it is reported
    /// (`[erasure] warn_days`).
    pub erasure_warn_days: i64,
}

impl Facts {
    /// The facts of the registered kinds under `settings`.
    pub fn of(settings: &Settings) -> Self {
        let budget = registry::pool_budget(settings.queue.concurrency);
        let (_, exceptions) = explain::id_forms();
        let form = |subject: &str| {
            exceptions
                .iter()
                .find(|(s, _)| *s == subject)
                .map(|(_, form)| form.clone())
        };
        Self {
            budget,
            max_connections: settings.database.max_connections,
            widest: KINDS
                .iter()
                .filter(|kind| !kind.beside() && kind.connections() == budget.per_hop)
                .map(|kind| kind.name())
                .collect(),
            subjects: explain::subjects()
                .into_iter()
                .map(|subject| (subject, form(subject)))
                .collect(),
            not_nightly: KINDS
                .iter()
                .filter(|kind| kind.cadence(settings) != Cadence::Nightly)
                .map(|kind| kind.name())
                .collect(),
            erasure_warn_days: settings
                .jobs
                .get::<ErasureSettings>(Erase::NAME)
                .warn
                .num_days(),
        }
    }

    /// The facts under the built-in defaults, with no file or environment over them: what the
    /// committed blocks say.
    ///
    /// # Errors
    /// [`Error::Defaults`] if `config/default.toml` itself is invalid.
    pub fn defaults() -> Result<Self, Error> {
        let settings = Settings::defaults(&registry::sections()).map_err(Error::Defaults)?;
        Ok(Self::of(&settings))
    }
}

/// Why the blocks could not be read, checked or written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the built-in defaults (config/default.toml) do not load")]
    Defaults(#[source] ConfigError),
    #[error("could not read {} (run `sexton generate` from the repository's root)", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("could not write {}", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: {problem}")]
    Markers { file: &'static str, problem: String },
    #[error(
        "{} generated block{} out of date ({}): run `{COMMAND}` and commit the result",
        .0.len(),
        if .0.len() == 1 { " is" } else { "s are" },
        .0.join(", ")
    )]
    Stale(Vec<String>),
}

/// One block as its file holds it and as the code renders it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    /// The file, relative to the repository's root.
    pub file: &'static str,
    /// The block's name in it.
    pub block: &'static str,
    /// What the file holds between the markers.
    pub committed: String,
    /// What the code renders there.
    pub generated: String,
}

impl Rendered {
    /// Whether the file says what the code does.
    pub fn is_current(&self) -> bool {
        self.committed == self.generated
    }
}

/// Every file holding generated blocks, relative to the repository's root.
pub fn files() -> Vec<&'static str> {
    let files: BTreeSet<&'static str> = BLOCKS.iter().map(|block| block.file).collect();
    files.into_iter().collect()
}

/// Every block of the files under `root`, as committed and as rendered from `facts`.
///
/// # Errors
/// [`Error::Read`] for a file that cannot be read, [`Error::Markers`] for a file whose markers
/// are unclosed, unknown, repeated or missing.
pub fn blocks(root: &Path, facts: &Facts) -> Result<Vec<Rendered>, Error> {
    let mut all = Vec::new();
    for file in files() {
        let (_, rendered) = regenerate(file, &read(root, file)?, facts)?;
        all.extend(rendered);
    }
    Ok(all)
}

/// Fails naming every block under `root` that does not say what `facts` do.
///
/// # Errors
/// [`Error::Stale`] naming them; as [`blocks`].
pub fn check(root: &Path, facts: &Facts) -> Result<(), Error> {
    let stale: Vec<String> = blocks(root, facts)?
        .into_iter()
        .filter(|block| !block.is_current())
        .map(|block| format!("{}: {}", block.file, block.block))
        .collect();
    if stale.is_empty() {
        Ok(())
    } else {
        Err(Error::Stale(stale))
    }
}

/// Rewrites every block under `root` from `facts`; the files that changed.
///
/// # Errors
/// [`Error::Write`] for a file that cannot be written; as [`blocks`]. Nothing is written unless
/// every file's markers are sound.
pub fn write(root: &Path, facts: &Facts) -> Result<Vec<&'static str>, Error> {
    let mut changed = Vec::new();
    for file in files() {
        let text = read(root, file)?;
        let (generated, _) = regenerate(file, &text, facts)?;
        if generated != text {
            changed.push((file, generated));
        }
    }
    for (file, text) in &changed {
        let path = root.join(file);
        std::fs::write(&path, text).map_err(|source| Error::Write { path, source })?;
    }
    Ok(changed.into_iter().map(|(file, _)| file).collect())
}

fn read(root: &Path, file: &str) -> Result<String, Error> {
    let path = root.join(file);
    std::fs::read_to_string(&path).map_err(|source| Error::Read { path, source })
}

/// `text`, the contents of `file`, with every block rendered from `facts`, and each block as
/// committed and as rendered.
fn regenerate(
    file: &'static str,
    text: &str,
    facts: &Facts,
) -> Result<(String, Vec<Rendered>), Error> {
    let marked = Syntax::of(file)
        .blocks(text)
        .map_err(|problem| Error::Markers { file, problem })?;
    let own: Vec<&Block> = BLOCKS.iter().filter(|block| block.file == file).collect();
    let mut names = BTreeSet::new();
    for found in &marked {
        if !own.iter().any(|block| block.name == found.name) {
            let known: Vec<&str> = own.iter().map(|block| block.name).collect();
            return Err(Error::Markers {
                file,
                problem: format!(
                    "unknown generated block {:?}; expected one of: {}",
                    found.name,
                    known.join(", ")
                ),
            });
        }
        if !names.insert(found.name.as_str()) {
            return Err(Error::Markers {
                file,
                problem: format!("generated block {:?} appears twice", found.name),
            });
        }
    }
    if let Some(missing) = own.iter().find(|block| !names.contains(block.name)) {
        return Err(Error::Markers {
            file,
            problem: format!(
                "no generated block {:?}: put its markers back where the fact belongs",
                missing.name
            ),
        });
    }
    let mut out = String::with_capacity(text.len());
    let mut rendered = Vec::new();
    let mut at = 0;
    for found in &marked {
        let block = own
            .iter()
            .find(|block| block.name == found.name)
            .expect("checked above");
        let generated = found.fill(&(block.render)(facts));
        out.push_str(&text[at..found.content.start]);
        out.push_str(&generated);
        at = found.content.end;
        rendered.push(Rendered {
            file,
            block: block.name,
            committed: text[found.content.clone()].to_owned(),
            generated,
        });
    }
    out.push_str(&text[at..]);
    Ok((out, rendered))
}

/// How a file marks its blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Syntax {
    /// HTML comments, within a line or on lines of their own.
    Markdown,
    /// `#` comment lines (TOML, YAML), the block's lines between them.
    Comments,
}

const MARKDOWN_START: &str = "<!-- generated: ";
const MARKDOWN_START_CLOSE: &str = " -->";
const MARKDOWN_END: &str = "<!-- end generated -->";
const COMMENT_START: &str = "# generated: ";
const COMMENT_END: &str = "# end generated";

/// A block as marked in a file.
#[derive(Debug)]
struct Marked {
    name: String,
    /// Where its contents are, between the markers.
    content: Range<usize>,
    /// How its contents are laid out.
    layout: Layout,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Layout {
    /// Within a line of Markdown.
    Inline,
    /// On lines of their own between the markers' lines, in Markdown.
    Lines,
    /// Lines between comment lines, each indented as the opening one is.
    Indented(String),
}

impl Marked {
    /// What goes between the markers for `rendered`.
    fn fill(&self, rendered: &str) -> String {
        match &self.layout {
            Layout::Inline => rendered.to_owned(),
            Layout::Lines => format!("\n{rendered}\n"),
            Layout::Indented(indent) => rendered
                .lines()
                .map(|line| format!("{indent}{line}\n"))
                .collect(),
        }
    }
}

impl Syntax {
    fn of(file: &str) -> Self {
        if file.ends_with(".md") {
            Self::Markdown
        } else {
            Self::Comments
        }
    }

    /// The blocks marked in `text`, in order.
    fn blocks(self, text: &str) -> Result<Vec<Marked>, String> {
        match self {
            Self::Markdown => markdown_blocks(text),
            Self::Comments => comment_blocks(text),
        }
    }
}

fn markdown_blocks(text: &str) -> Result<Vec<Marked>, String> {
    let mut blocks = Vec::new();
    let mut at = 0;
    while let Some(offset) = text[at..].find(MARKDOWN_START) {
        let name_start = at + offset + MARKDOWN_START.len();
        let name_len = text[name_start..]
            .find(MARKDOWN_START_CLOSE)
            .ok_or_else(|| format!("unclosed {MARKDOWN_START:?} at byte {}", at + offset))?;
        let name = text[name_start..name_start + name_len].trim().to_owned();
        let start = name_start + name_len + MARKDOWN_START_CLOSE.len();
        let len = text[start..]
            .find(MARKDOWN_END)
            .ok_or_else(|| format!("generated block {name:?} has no {MARKDOWN_END:?}"))?;
        let content = start..start + len;
        if text[content.clone()].contains(MARKDOWN_START) {
            return Err(format!(
                "generated block {name:?} has no {MARKDOWN_END:?} before the next block"
            ));
        }
        let layout = if text[content.clone()].starts_with('\n') {
            Layout::Lines
        } else {
            Layout::Inline
        };
        at = content.end + MARKDOWN_END.len();
        blocks.push(Marked {
            name,
            content,
            layout,
        });
    }
    if text.matches(MARKDOWN_END).count() != blocks.len() {
        return Err(format!("a {MARKDOWN_END:?} closes no generated block"));
    }
    Ok(blocks)
}

fn comment_blocks(text: &str) -> Result<Vec<Marked>, String> {
    let mut blocks = Vec::new();
    // The block being read: its name, indentation and where its contents start.
    let mut open: Option<(String, String, usize)> = None;
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim();
        let next = at + line.len();
        if let Some(name) = trimmed.strip_prefix(COMMENT_START) {
            if let Some((open, ..)) = &open {
                return Err(format!(
                    "generated block {open:?} has no {COMMENT_END:?} before the next block"
                ));
            }
            let indent = &line[..line.len() - line.trim_start().len()];
            open = Some((name.trim().to_owned(), indent.to_owned(), next));
        } else if trimmed == COMMENT_END {
            let (name, indent, start) = open
                .take()
                .ok_or_else(|| format!("a {COMMENT_END:?} closes no generated block"))?;
            blocks.push(Marked {
                name,
                content: start..at,
                layout: Layout::Indented(indent),
            });
        }
        at = next;
    }
    match open {
        Some((name, ..)) => Err(format!("generated block {name:?} has no {COMMENT_END:?}")),
        None => Ok(blocks),
    }
}

/// `text` as `#` comment lines of at most [`WIDTH`] characters.
fn comment(text: &str) -> String {
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::from("#");
    for word in text.split_whitespace() {
        if line.len() > 1 && line.len() + 1 + word.len() > WIDTH {
            lines.push(std::mem::replace(&mut line, String::from("#")));
        }
        line.push(' ');
        line.push_str(word);
    }
    lines.push(line);
    lines.join("\n")
}

/// Whose hops hold [`PoolBudget::per_hop`] connections, each name through `quote`.
fn widest(facts: &Facts, quote: fn(&str) -> String) -> String {
    if facts.widest.len() == KINDS.iter().filter(|kind| !kind.beside()).count() {
        "every kind's".to_owned()
    } else {
        let names: Vec<String> = facts.widest.iter().map(|name| quote(name)).collect();
        format!("the widest: {}", names.join(", "))
    }
}

/// How many connections the default pool has to spare.
fn spare(facts: &Facts) -> String {
    match u64::from(facts.max_connections).saturating_sub(facts.budget.needed()) {
        0 => "none to spare".to_owned(),
        spare => format!("{spare} spare"),
    }
}

/// The kinds whose hops run beside the shared budget, each name through `quote`.
fn beside(quote: fn(&str) -> String) -> String {
    let names: Vec<String> = KINDS
        .iter()
        .filter(|kind| kind.beside())
        .map(|kind| quote(kind.name()))
        .collect();
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// FL-6 in `config/default.toml`'s `[database]`.
fn pool_budget_comment(facts: &Facts) -> String {
    let budget = &facts.budget;
    comment(&format!(
        "With the defaults: {} hops x {} connections ({}) + {} beside them ({}) \
         + {CONNECTIONS_PER_QUEUE} for each of the {} queues (the nightly one and one per job \
         kind) + {FIXED_CONNECTIONS} = {}; the default of {} leaves {}.",
        budget.concurrency,
        budget.per_hop,
        widest(facts, str::to_owned),
        budget.beside,
        beside(str::to_owned),
        budget.queues,
        budget.needed(),
        facts.max_connections,
        spare(facts),
    ))
}

/// FL-6 in docs/operating.md's Sizing, within its sentence.
fn pool_budget_sentence(facts: &Facts) -> String {
    let budget = &facts.budget;
    format!(
        "with the defaults, `queue.concurrency` ({}) × {} connections ({}) + {} for the hop \
         beside them ({}, in a slot of its own) + {CONNECTIONS_PER_QUEUE} for each of the \
         {} queues (the nightly one and one per job kind) + {FIXED_CONNECTIONS} = {}; the default \
         `database.max_connections` ({}) leaves {}",
        budget.concurrency,
        budget.per_hop,
        widest(facts, |name| format!("`{name}`")),
        budget.beside,
        beside(|name| format!("`{name}`")),
        budget.queues,
        budget.needed(),
        facts.max_connections,
        spare(facts),
    )
}

/// OP-1 in docs/jobs.md: every subject of `sexton explain`, with its id's form where it is not
/// the usual one.
fn explain_subjects(facts: &Facts) -> String {
    facts
        .subjects
        .iter()
        .map(|(subject, form)| match form {
            Some(form) => format!("`{subject}` ({form})"),
            None => format!("`{subject}`"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// OP-5 in deploy/prometheus/alerts.yml: `SextonNoSuccessfulPass`'s expression, leaving out
/// exactly the kinds not run nightly (one given a cadence of its own would otherwise page every
/// night and two hours, and a nightly kind left out would never page).
fn missed_pass_expr(facts: &Facts) -> String {
    let selector = match facts.not_nightly.as_slice() {
        [] => String::new(),
        [kind] => format!("{{kind!=\"{kind}\"}}"),
        kinds => format!("{{kind!~\"{}\"}}", kinds.join("|")),
    };
    format!(
        "expr: time() - max by (kind) (sexton_last_success_timestamp_seconds{selector}) > \
         {MISSED_PASS_HOURS} * 3600"
    )
}

/// RQ-7 in deploy/prometheus/alerts.yml: `SextonErasureOverdue`'s warning, from `[erasure]
/// warn_days` before the earliest due date of an open request until that date (its second rule
/// pages once the date has passed). With no open request the gauge reads +Inf and neither holds.
fn erasure_due_expr(facts: &Facts) -> String {
    format!(
        "expr: min(sexton_erasure_due_seconds) < {} * 86400 and min(sexton_erasure_due_seconds) >= 0",
        facts.erasure_warn_days
    )
}

#[cfg(test)]
mod tests;
