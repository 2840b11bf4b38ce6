//! Grouping suggestions: which queued tasks belong in one list.
//!
//! Every pair of queued tasks is scored with five weighted criteria (seed 001's defaults: file
//! overlap 0.3, dependencies 0.25, category 0.2, description similarity 0.15, component 0.1);
//! pairs at or above a threshold join into groups, and each group of two or more is a suggestion
//! with a score and a reason people can read.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use serde::{Deserialize, Serialize};

use self::naming::{group_name, unique_name};
use super::model::{BacklogTask, FieldError, Placement, TaskStatus, display_id, file_op_name};
use crate::plan::{FileOp, RelationshipKind};

/// The weight of each criterion, per project. Each is in 0–1; they need not sum to 1 (a pair's
/// score is divided by their sum), but at least one must be above 0.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Weights {
    pub file_overlap: f64,
    pub dependency: f64,
    pub category: f64,
    pub description: f64,
    pub component: f64,
}

impl Default for Weights {
    fn default() -> Self {
        Self {
            file_overlap: 0.3,
            dependency: 0.25,
            category: 0.2,
            description: 0.15,
            component: 0.1,
        }
    }
}

impl Weights {
    /// Each weight with its name, in criterion order.
    fn named(&self) -> [(&'static str, f64); 5] {
        [
            ("file_overlap", self.file_overlap),
            ("dependency", self.dependency),
            ("category", self.category),
            ("description", self.description),
            ("component", self.component),
        ]
    }

    /// Checks that each weight is a number in 0–1 (the error names `weights.<criterion>`) and
    /// that at least one is above 0 (the error names `weights`).
    pub fn check(&self) -> Result<(), FieldError> {
        for (name, weight) in self.named() {
            if !weight.is_finite() || !(0.0..=1.0).contains(&weight) {
                return Err(FieldError::new(
                    format!("weights.{name}"),
                    format!("{weight} is not a weight (expected a number from 0 to 1)"),
                ));
            }
        }
        if self.sum() <= 0.0 {
            return Err(FieldError::new(
                "weights",
                "every weight is 0; at least one criterion must count",
            ));
        }
        Ok(())
    }

    fn sum(&self) -> f64 {
        self.named().iter().map(|(_, weight)| weight).sum()
    }
}

/// The score at or above which two tasks are suggested together, unless a request names another.
///
/// Two tasks that only share a category score 0.2 with the default weights, plus at most 0.15
/// for wording that happens to be alike; a shared component or file, or a link, is needed on top
/// of that to reach 0.4.
pub const DEFAULT_THRESHOLD: f64 = 0.4;

/// Most shared paths or components a reason names before it says "and N more".
const MAX_NAMED: usize = 3;

/// Lowest description similarity that is given as a reason.
const MIN_SIMILARITY_REASON: f64 = 0.5;

/// Most reasons a suggestion's reason joins.
const MAX_GROUP_REASONS: usize = 4;

/// One pair's score (0–1) and the reasons behind it, strongest first.
#[derive(Clone, Debug, PartialEq)]
pub struct PairScore {
    pub score: f64,
    pub reasons: Vec<String>,
}

/// A suggested list: its tasks (numbers, ascending), a name, a score and a reason.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Suggestion {
    pub tasks: Vec<u32>,
    pub name: String,
    pub score: f64,
    pub reason: String,
}

/// Returns a file's component: its parent directory (`src/auth/login.rs` → `src/auth`); a
/// top-level file's component is `""`, the project's root.
pub fn component(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(dir, _)| dir)
}

/// Scores two tasks: each criterion gives 0–1, and the score is their weighted mean,
/// Σ weight·criterion / Σ weight. The score is the same both ways round; the reasons name what
/// the tasks share, strongest contribution first.
///
/// - file overlap: the Jaccard index of the two sets of paths;
/// - dependency: 1 when one task `depends_on`, `blocks`, `enables` or is a `subtask_of` the
///   other, 0.5 when both depend on a common task;
/// - category: 1 when the categories are equal;
/// - description: the Sørensen–Dice similarity of the lowercased titles and descriptions (a
///   reason from 0.5 on);
/// - component: the Jaccard index of the two sets of components (see [`component`]); the root
///   is left out, as every project has top-level files.
///
/// Weights that fail [`Weights::check`] score every pair 0.
pub fn score_pair(a: &BacklogTask, b: &BacklogTask, weights: &Weights) -> PairScore {
    let scored = score_features(&Features::of(a), &Features::of(b), weights);
    PairScore {
        score: scored.score,
        reasons: scored.reasons.into_iter().map(|r| r.text).collect(),
    }
}

/// Suggests lists for the tasks waiting in the evaluation queue (placed in no list, neither
/// completed nor failed): every pair scoring at least `threshold` (and above 0) is joined, and
/// each connected group of two or more tasks is a suggestion.
///
/// A suggestion's score is the mean of the pair scores that joined it, to 3 decimals; its reason
/// joins the strongest reason of each criterion across those pairs (at most 4); its name is a
/// slug of the component the most of its tasks touch, if two or more do (`src-auth`), else of its
/// most common category (`bug-fixes`), with `-2`, `-3`… added to keep names unique. Suggestions
/// come highest score first, then by their first task.
pub fn suggest(tasks: &[BacklogTask], weights: &Weights, threshold: f64) -> Vec<Suggestion> {
    let queued: Vec<Features<'_>> = tasks
        .iter()
        .filter(|task| is_queued(task))
        .map(Features::of)
        .collect();
    let mut sets = UnionFind::new(queued.len());
    let mut joined = Vec::new();
    for (i, a) in queued.iter().enumerate() {
        for (j, b) in queued.iter().enumerate().skip(i + 1) {
            let scored = score_features(a, b, weights);
            if scored.score > 0.0 && scored.score >= threshold {
                sets.union(i, j);
                joined.push((i, scored));
            }
        }
    }

    // Every pair joined lies inside one group: the group of its first task.
    let mut groups: BTreeMap<usize, Vec<Scored>> = BTreeMap::new();
    for (i, scored) in joined {
        groups.entry(sets.find(i)).or_default().push(scored);
    }
    let mut members: BTreeMap<usize, Vec<&Features<'_>>> = BTreeMap::new();
    for (i, features) in queued.iter().enumerate() {
        members.entry(sets.find(i)).or_default().push(features);
    }

    let mut drafts: Vec<(Vec<u32>, f64, String, String)> = groups
        .into_iter()
        .filter_map(|(root, pairs)| {
            let group = members.remove(&root)?;
            let mut numbers: Vec<u32> = group.iter().map(|f| f.task.number).collect();
            numbers.sort_unstable();
            numbers.dedup();
            if numbers.len() < 2 {
                return None;
            }
            let mean = pairs.iter().map(|p| p.score).sum::<f64>() / pairs.len() as f64;
            let score = (mean * 1000.0).round() / 1000.0;
            Some((numbers, score, group_name(&group), group_reason(&pairs)))
        })
        .collect();
    drafts.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));

    let mut taken = HashSet::new();
    drafts
        .into_iter()
        .map(|(tasks, score, base, reason)| Suggestion {
            name: unique_name(&base, &mut taken),
            tasks,
            score,
            reason,
        })
        .collect()
}

/// Returns the suggestions [`suggest`] makes that hold task `trigger`: what to offer when that
/// task is created or its dependencies change.
pub fn suggest_for(
    tasks: &[BacklogTask],
    weights: &Weights,
    threshold: f64,
    trigger: u32,
) -> Vec<Suggestion> {
    suggest(tasks, weights, threshold)
        .into_iter()
        .filter(|suggestion| suggestion.tasks.contains(&trigger))
        .collect()
}

/// Returns true for a task that can still be suggested: queued, neither completed nor failed.
fn is_queued(task: &BacklogTask) -> bool {
    task.placement == Placement::Evaluation
        && !matches!(task.status, TaskStatus::Completed | TaskStatus::Failed)
}

/// The five criteria, in the order of [`Weights`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Criterion {
    FileOverlap,
    Dependency,
    Category,
    Description,
    Component,
}

/// One reason of a pair: its criterion, its weighted contribution and its text.
#[derive(Clone, Debug)]
struct Reason {
    criterion: Criterion,
    contribution: f64,
    text: String,
}

/// A pair's score and its reasons, strongest first.
#[derive(Clone, Debug)]
struct Scored {
    score: f64,
    reasons: Vec<Reason>,
}

/// What a task brings to a comparison, read once per task.
#[derive(Debug)]
struct Features<'t> {
    task: &'t BacklogTask,
    /// Each path with the task's first operation on it.
    paths: BTreeMap<&'t str, FileOp>,
    /// The components of the paths, without the root.
    components: BTreeSet<&'t str>,
    /// The lowercased title and description.
    text: String,
    dependencies: BTreeSet<u32>,
}

impl<'t> Features<'t> {
    fn of(task: &'t BacklogTask) -> Self {
        let mut paths = BTreeMap::new();
        for file in &task.files {
            paths.entry(file.path.as_str()).or_insert(file.op);
        }
        let components = paths
            .keys()
            .map(|path| component(path))
            .filter(|component| !component.is_empty())
            .collect();
        Self {
            task,
            paths,
            components,
            text: format!("{} {}", task.title, task.description).to_lowercase(),
            dependencies: task.dependencies().collect(),
        }
    }
}

fn score_features(a: &Features<'_>, b: &Features<'_>, weights: &Weights) -> Scored {
    if weights.check().is_err() {
        return Scored {
            score: 0.0,
            reasons: Vec::new(),
        };
    }
    let criteria = [
        (
            Criterion::FileOverlap,
            weights.file_overlap,
            file_overlap(a, b),
        ),
        (Criterion::Dependency, weights.dependency, dependency(a, b)),
        (Criterion::Category, weights.category, category(a, b)),
        (
            Criterion::Description,
            weights.description,
            description(a, b),
        ),
        (Criterion::Component, weights.component, components(a, b)),
    ];
    let mut sum = 0.0;
    let mut reasons = Vec::new();
    for (criterion, weight, (value, text)) in criteria {
        let contribution = weight * value;
        sum += contribution;
        if let Some(text) = text.filter(|_| contribution > 0.0) {
            reasons.push(Reason {
                criterion,
                contribution,
                text,
            });
        }
    }
    // A stable sort: equal contributions keep the criteria's order.
    reasons.sort_by(|x, y| y.contribution.total_cmp(&x.contribution));
    Scored {
        // `check` saw a positive sum.
        score: (sum / weights.sum()).clamp(0.0, 1.0),
        reasons,
    }
}

/// A criterion's value, 0–1, and its reason, if it has one.
type Measured = (f64, Option<String>);

fn file_overlap(a: &Features<'_>, b: &Features<'_>) -> Measured {
    let shared: Vec<String> = a
        .paths
        .iter()
        .filter(|(path, _)| b.paths.contains_key(*path))
        .map(|(path, op)| format!("{path} ({})", file_op_name(*op)))
        .collect();
    let value = jaccard(shared.len(), a.paths.len(), b.paths.len());
    let reason = (!shared.is_empty()).then(|| format!("share {}", name_some(&shared)));
    (value, reason)
}

fn dependency(a: &Features<'_>, b: &Features<'_>) -> Measured {
    if let Some(text) = link_between(a.task, b.task).or_else(|| link_between(b.task, a.task)) {
        return (1.0, Some(text));
    }
    let common: Vec<String> = a
        .dependencies
        .intersection(&b.dependencies)
        .map(|number| display_id(*number))
        .collect();
    if common.is_empty() {
        (0.0, None)
    } else {
        (0.5, Some(format!("both depend on {}", name_some(&common))))
    }
}

/// Returns `T-12 depends on T-9` for the first link from `from` to `to` that ties them together.
fn link_between(from: &BacklogTask, to: &BacklogTask) -> Option<String> {
    from.links
        .iter()
        .filter(|link| link.target == to.number)
        .find_map(|link| {
            let verb = match link.kind {
                RelationshipKind::DependsOn => "depends on",
                RelationshipKind::Blocks => "blocks",
                RelationshipKind::Enables => "enables",
                RelationshipKind::SubtaskOf => "is a subtask of",
                _ => return None,
            };
            Some(format!("{} {verb} {}", from.display_id(), to.display_id()))
        })
}

fn category(a: &Features<'_>, b: &Features<'_>) -> Measured {
    if a.task.category == b.task.category {
        (1.0, Some(format!("both {}", a.task.category)))
    } else {
        (0.0, None)
    }
}

fn description(a: &Features<'_>, b: &Features<'_>) -> Measured {
    let value = strsim::sorensen_dice(&a.text, &b.text).clamp(0.0, 1.0);
    let reason =
        (value >= MIN_SIMILARITY_REASON).then(|| format!("similar descriptions ({value:.2})"));
    (value, reason)
}

fn components(a: &Features<'_>, b: &Features<'_>) -> Measured {
    let shared: Vec<String> = a
        .components
        .intersection(&b.components)
        .map(|component| (*component).to_owned())
        .collect();
    let value = jaccard(shared.len(), a.components.len(), b.components.len());
    let reason = match shared.as_slice() {
        [] => None,
        [one] => Some(format!("same component {one}")),
        _ => Some(format!("same components {}", name_some(&shared))),
    };
    (value, reason)
}

/// The Jaccard index of two sets from their sizes and the size of their intersection; 0 for two
/// empty sets.
fn jaccard(shared: usize, a: usize, b: usize) -> f64 {
    let union = a + b - shared;
    if union == 0 {
        0.0
    } else {
        shared as f64 / union as f64
    }
}

/// Joins at most [`MAX_NAMED`] items with ", " and says how many more there are.
fn name_some(items: &[String]) -> String {
    let named = items[..items.len().min(MAX_NAMED)].join(", ");
    match items.len().saturating_sub(MAX_NAMED) {
        0 => named,
        more => format!("{named} and {more} more"),
    }
}

/// Joins the strongest reason of each criterion across a group's pairs, strongest criterion
/// first: a reason's strength is the sum of its contributions over the pairs that give it.
fn group_reason(pairs: &[Scored]) -> String {
    let mut strength: BTreeMap<(Criterion, &str), f64> = BTreeMap::new();
    for reason in pairs.iter().flat_map(|pair| &pair.reasons) {
        *strength
            .entry((reason.criterion, reason.text.as_str()))
            .or_default() += reason.contribution;
    }
    let mut best: BTreeMap<Criterion, (&str, f64)> = BTreeMap::new();
    for ((criterion, text), value) in strength {
        // Texts come in order, so the first of equally strong texts stays.
        match best.get(&criterion) {
            Some((_, kept)) if *kept >= value => {}
            _ => {
                best.insert(criterion, (text, value));
            }
        }
    }
    let mut ranked: Vec<(Criterion, &str, f64)> = best
        .into_iter()
        .map(|(criterion, (text, value))| (criterion, text, value))
        .collect();
    ranked.sort_by(|x, y| y.2.total_cmp(&x.2).then(x.0.cmp(&y.0)));
    ranked
        .iter()
        .take(MAX_GROUP_REASONS)
        .map(|(_, text, _)| *text)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Disjoint sets of indices, joined pair by pair; the smaller index is a set's root.
#[derive(Debug)]
struct UnionFind {
    parent: Vec<usize>,
}

impl UnionFind {
    fn new(len: usize) -> Self {
        Self {
            parent: (0..len).collect(),
        }
    }

    fn find(&mut self, mut i: usize) -> usize {
        while self.parent[i] != i {
            self.parent[i] = self.parent[self.parent[i]];
            i = self.parent[i];
        }
        i
    }

    fn union(&mut self, a: usize, b: usize) {
        let (a, b) = (self.find(a), self.find(b));
        let (root, child) = (a.min(b), a.max(b));
        self.parent[child] = root;
    }
}

mod naming;
#[cfg(test)]
mod tests;
