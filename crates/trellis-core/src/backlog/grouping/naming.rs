//! A suggested list's name: a slug of its main component or category, unique among the
//! suggestions.

use std::collections::{BTreeMap, HashSet};

use super::Features;
use crate::backlog::model::{Category, check_slug};

/// Longest slug [`check_slug`] accepts.
const MAX_SLUG: usize = 64;

/// Names a group after the component the most of its tasks touch, if two or more do, else after
/// its most common category.
pub(super) fn group_name(group: &[&Features<'_>]) -> String {
    let mut touched: BTreeMap<&str, usize> = BTreeMap::new();
    for features in group {
        for component in &features.components {
            *touched.entry(component).or_default() += 1;
        }
    }
    // The most tasks, then the first name: `max_by` keeps the last of equals, so names compare
    // reversed.
    let top = touched
        .iter()
        .filter(|(_, count)| **count >= 2)
        .max_by(|x, y| x.1.cmp(y.1).then(y.0.cmp(x.0)));
    if let Some(slug) = top.and_then(|(component, _)| slugify(component)) {
        return slug;
    }
    let mut counts: BTreeMap<Category, usize> = BTreeMap::new();
    for features in group {
        *counts.entry(features.task.category).or_default() += 1;
    }
    let category = counts
        .iter()
        .max_by(|x, y| x.1.cmp(y.1).then(y.0.cmp(x.0)))
        .map_or(Category::Task, |(category, _)| *category);
    category_slug(category).to_owned()
}

/// A list name for a group of one category.
fn category_slug(category: Category) -> &'static str {
    match category {
        Category::Feature => "features",
        Category::Bug => "bug-fixes",
        Category::Task => "tasks",
        Category::Improvement => "improvements",
        Category::Refactor => "refactoring",
        Category::Test => "tests",
        Category::Docs => "docs",
        Category::Infra => "infra",
        Category::Research => "research",
    }
}

/// Turns text into a slug: lowercase ASCII letters and digits, every other run of characters one
/// `-`, none at either end, at most [`MAX_SLUG`] bytes. `None` when nothing is left.
pub(super) fn slugify(text: &str) -> Option<String> {
    let mut slug = String::new();
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            slug.push(c.to_ascii_lowercase());
        } else if !slug.is_empty() && !slug.ends_with('-') {
            slug.push('-');
        }
    }
    // The slug is ASCII, so any byte index is a character boundary.
    slug.truncate(MAX_SLUG);
    let slug = slug.trim_end_matches('-');
    (check_slug("name", slug).is_ok()).then(|| slug.to_owned())
}

/// Returns `base`, or `base-2`, `base-3`… (shortened to stay a valid slug), whichever is not
/// taken yet, and takes it.
pub(super) fn unique_name(base: &str, taken: &mut HashSet<String>) -> String {
    let mut name = base.to_owned();
    let mut n = 2;
    while taken.contains(&name) {
        let suffix = format!("-{n}");
        // Bases are ASCII slugs, so any byte index is a character boundary.
        let stem = base[..base.len().min(MAX_SLUG - suffix.len())].trim_end_matches('-');
        name = format!("{stem}{suffix}");
        n += 1;
    }
    taken.insert(name.clone());
    name
}
