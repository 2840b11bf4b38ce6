//! Expansion: the plan language's shorthands rewritten into a flat spec.
//!
//! A spec as written may declare `params` (referenced as `${params.<name>}` in task strings) and
//! `templates` (partial tasks a task starts from with `use:`), and a task may be a `for_each`
//! generator. [`expand`] resolves all of it and returns a flat [`PlanSpec`] that has none of these
//! left: the form [`super::compile`] validates, the planner returns over the wire and the
//! coordinator records. A flat spec expands to itself, so recompiling it gives the same plan.
//!
//! References are written `${params.<name>}`, and inside a `for_each` task `${item}`,
//! `${item.<key>}` (for items that are objects) and `${index}` (0-based). `$${` is a literal `${`.
//! A string of a task's `input` (or its `for_each`) that is exactly one reference is replaced by
//! the referenced JSON value itself, so a list param can fill an input list; anywhere else the
//! value is written into the text (strings as they are, numbers and booleans as JSON). Map keys are
//! taken literally. The flat spec writes every literal `${` as `$${`, which is what keeps expansion
//! idempotent.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::errors::{PlanError, PlanErrorKind, PlanErrors};
use super::limits::Limits;
use super::spec::{ParamSpec, PlanSpec, TaskSpec, TemplateSpec};
use super::suggest::{did_you_mean, unknown_name_hint};

/// Expands `spec` with these param values into a flat spec (see the module docs), with the
/// default [`Limits`].
pub fn expand(spec: PlanSpec, params: &BTreeMap<String, Value>) -> Result<PlanSpec, PlanErrors> {
    expand_with_limits(spec, params, &Limits::default())
}

/// Expands `spec` with these param values into a flat spec, refusing to generate more than
/// `limits.max_tasks` tasks.
pub fn expand_with_limits(
    spec: PlanSpec,
    params: &BTreeMap<String, Value>,
    limits: &Limits,
) -> Result<PlanSpec, PlanErrors> {
    let (flat, _) = expand_inner(spec, params, limits)?;
    escape_references(flat)
}

/// Where a task of the flat spec came from, to point errors found in it back at the source.
#[derive(Clone, Debug, Default)]
pub(crate) struct TaskOrigin {
    /// Its index in the spec as written.
    source: usize,
    /// Set for a task made by `for_each`: the item's index and the generated id.
    item: Option<(usize, String)>,
    /// Set when fan-in rewrote `depends_on`: the source position of each entry.
    depends_on: Option<Vec<usize>>,
}

/// For each task of the flat spec, where it came from.
#[derive(Clone, Debug, Default)]
pub(crate) struct SourceMap {
    tasks: Vec<TaskOrigin>,
    /// True when every flat task is the source task of the same index.
    identity: bool,
}

impl SourceMap {
    /// Rewrites the task indices of errors found in the flat spec into indices of the spec as
    /// written, and says which generated task an error is about.
    pub(crate) fn rewrite(&self, errors: PlanErrors) -> PlanErrors {
        if self.identity {
            return errors;
        }
        let errors = errors
            .into_vec()
            .into_iter()
            .map(|mut error| {
                let first = leading_task(&error.path);
                if let Some(origin) = first.and_then(|t| self.tasks.get(t))
                    && let Some(positions) = &origin.depends_on
                {
                    error.path = rewrite_position(&error.path, ".depends_on[", positions);
                }
                error.path = self.rewrite_text(&error.path);
                error.message = self.rewrite_text(&error.message);
                if let Some(origin) = first.and_then(|t| self.tasks.get(t))
                    && let Some((item, id)) = &origin.item
                {
                    error.message = format!(
                        "{} (in task {id:?}, made by for_each from item {item})",
                        error.message
                    );
                }
                error
            })
            .collect();
        PlanErrors::from_vec(errors)
    }

    /// Replaces every `tasks[N]` in `text` by the source index of flat task N.
    fn rewrite_text(&self, text: &str) -> String {
        let mut res = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(at) = rest.find("tasks[") {
            let after = &rest[at + "tasks[".len()..];
            let digits = after.bytes().take_while(u8::is_ascii_digit).count();
            res.push_str(&rest[..at + "tasks[".len()]);
            match after[..digits]
                .parse::<usize>()
                .ok()
                .and_then(|n| self.tasks.get(n))
            {
                Some(origin) if after[digits..].starts_with(']') => {
                    res.push_str(&origin.source.to_string());
                }
                _ => res.push_str(&after[..digits]),
            }
            rest = &after[digits..];
        }
        res.push_str(rest);
        res
    }
}

/// Replaces the index J in `<...>{field}J]...` by `positions[J]`.
fn rewrite_position(path: &str, field: &str, positions: &[usize]) -> String {
    let Some(at) = path.find(field) else {
        return path.to_owned();
    };
    let after = &path[at + field.len()..];
    let Some((j, rest)) = after.split_once(']') else {
        return path.to_owned();
    };
    match j.parse::<usize>().ok().and_then(|j| positions.get(j)) {
        Some(source) => format!("{}{source}]{rest}", &path[..at + field.len()]),
        None => path.to_owned(),
    }
}

/// Returns N when `path` starts with `tasks[N]`.
fn leading_task(path: &str) -> Option<usize> {
    let after = path.strip_prefix("tasks[")?;
    let (n, _) = after.split_once(']')?;
    n.parse().ok()
}

/// What `${...}` references can name in one string.
struct Scope<'a> {
    params: &'a BTreeMap<String, Value>,
    /// Inside a `for_each` task: the item and its index.
    item: Option<(&'a Value, usize)>,
}

/// Collects expansion errors.
struct Expander {
    errors: Vec<PlanError>,
}

impl Expander {
    fn error(&mut self, kind: PlanErrorKind, path: impl Into<String>, message: impl Into<String>) {
        self.errors.push(PlanError::new(kind, path, message));
    }

    fn error_with_hint(
        &mut self,
        kind: PlanErrorKind,
        path: impl Into<String>,
        message: impl Into<String>,
        hint: Option<String>,
    ) {
        let mut error = PlanError::new(kind, path, message);
        error.hint = hint;
        self.errors.push(error);
    }

    /// Resolves the values of the declared params: given, else default; checks names and types.
    fn params(
        &mut self,
        declared: &BTreeMap<String, ParamSpec>,
        given: &BTreeMap<String, Value>,
    ) -> BTreeMap<String, Value> {
        let mut res = BTreeMap::new();
        for name in given.keys() {
            if !declared.contains_key(name) {
                self.error_with_hint(
                    PlanErrorKind::UnknownReference,
                    format!("params.{name}"),
                    format!("a value was given for {name:?}, but the plan declares no such param"),
                    did_you_mean(name, declared.keys().map(String::as_str)).or_else(|| {
                        Some(if declared.is_empty() {
                            "the plan declares no params".to_owned()
                        } else {
                            let names: Vec<&str> = declared.keys().map(String::as_str).collect();
                            format!("declared params: {}", names.join(", "))
                        })
                    }),
                );
            }
        }
        for (name, spec) in declared {
            let path = format!("params.{name}");
            if !is_param_name(name) {
                self.error(
                    PlanErrorKind::InvalidId,
                    &path,
                    format!("param name {name:?} may use only A-Z a-z 0-9 _ -"),
                );
                continue;
            }
            if let (Some(ty), Some(default)) = (spec.param_type, &spec.default)
                && !ty.accepts(default)
            {
                self.error(
                    PlanErrorKind::InvalidValue,
                    format!("{path}.default"),
                    format!(
                        "default of param {name:?} must be {}, got {}",
                        ty.with_article(),
                        describe(default)
                    ),
                );
                continue;
            }
            let value = match (given.get(name), &spec.default) {
                (Some(v), _) => v,
                (None, Some(d)) => d,
                (None, None) => {
                    self.error_with_hint(
                        PlanErrorKind::MissingParam,
                        &path,
                        format!(
                            "param {name:?} is required: it has no default and no value was given"
                        ),
                        Some(format!(
                            "give it a value (e.g. --param {name}=...) or a default"
                        )),
                    );
                    continue;
                }
            };
            if let Some(ty) = spec.param_type
                && !ty.accepts(value)
            {
                let hint = (ty == super::spec::ParamType::String
                    && (value.is_number() || value.is_boolean()))
                .then(|| {
                    format!("values are read as JSON: quote it to pass text, {name}='\"{value}\"'")
                });
                self.error_with_hint(
                    PlanErrorKind::InvalidValue,
                    &path,
                    format!(
                        "param {name:?} must be {}, got {}",
                        ty.with_article(),
                        describe(value)
                    ),
                    hint,
                );
                continue;
            }
            res.insert(name.clone(), value.clone());
        }
        res
    }

    /// Resolves one reference (the text between `${` and `}`).
    fn resolve<'v>(&mut self, expr: &str, scope: &Scope<'v>, path: &str) -> Option<&'v Value> {
        if let Some(name) = expr.strip_prefix("params.") {
            let found = scope.params.get(name);
            if found.is_none() {
                self.error_with_hint(
                    PlanErrorKind::UnknownReference,
                    path,
                    format!("unknown param {name:?} in ${{{expr}}}"),
                    did_you_mean(name, scope.params.keys().map(String::as_str))
                        .or_else(|| Some("declare it under `params:`".to_owned())),
                );
            }
            return found;
        }
        let in_for_each = |this: &mut Self| {
            this.error_with_hint(
                PlanErrorKind::UnknownReference,
                path,
                format!("${{{expr}}} is defined only in a task with for_each"),
                None,
            );
        };
        if expr == "item" || expr == "index" || expr.starts_with("item.") {
            let Some((item, _)) = scope.item else {
                in_for_each(self);
                return None;
            };
            if expr == "item" {
                return Some(item);
            }
            if expr == "index" {
                // Index values are made by `expand_task`, which passes them in the item's place
                // when asked; see `Scope`.
                return None;
            }
            let key = &expr["item.".len()..];
            let found = item.as_object().and_then(|o| o.get(key));
            if found.is_none() {
                let hint = item
                    .as_object()
                    .and_then(|o| did_you_mean(key, o.keys().map(String::as_str)));
                self.error_with_hint(
                    PlanErrorKind::UnknownReference,
                    path,
                    format!(
                        "the for_each item has no field {key:?} (item is {})",
                        describe(item)
                    ),
                    hint,
                );
            }
            return found;
        }
        self.error_with_hint(
            PlanErrorKind::UnknownReference,
            path,
            format!("unknown reference ${{{expr}}}"),
            Some(
                "references are ${params.<name>}, and in a for_each task ${item}, ${item.<key>} and ${index}; write $${ for a literal ${"
                    .to_owned(),
            ),
        );
        None
    }

    /// Substitutes the references of one string. Returns the new value when anything changed
    /// (`json`: a string that is exactly one reference becomes the referenced value).
    fn substitute(
        &mut self,
        text: &str,
        scope: &Scope<'_>,
        json: bool,
        path: &str,
    ) -> Option<Value> {
        if !text.contains("${") {
            return None;
        }
        if json && let Some(expr) = whole_reference(text) {
            if expr == "index"
                && let Some((_, index)) = scope.item
            {
                return Some(Value::from(index));
            }
            return self.resolve(expr, scope, path).cloned();
        }
        let mut res = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(at) = rest.find("${") {
            if at > 0 && rest.as_bytes()[at - 1] == b'$' {
                res.push_str(&rest[..at - 1]);
                res.push_str("${");
                rest = &rest[at + 2..];
                continue;
            }
            res.push_str(&rest[..at]);
            let after = &rest[at + 2..];
            let Some(end) = after.find('}') else {
                self.error_with_hint(
                    PlanErrorKind::InvalidValue,
                    path,
                    format!("unterminated reference in {text:?}"),
                    Some("close it with `}`, or write $${ for a literal ${".to_owned()),
                );
                return None;
            };
            let expr = &after[..end];
            rest = &after[end + 1..];
            if expr == "index"
                && let Some((_, index)) = scope.item
            {
                res.push_str(&index.to_string());
                continue;
            }
            let value = self.resolve(expr, scope, path)?;
            match value {
                Value::String(s) => res.push_str(s),
                Value::Number(n) => res.push_str(&n.to_string()),
                Value::Bool(b) => res.push_str(if *b { "true" } else { "false" }),
                other => {
                    let hint = json.then(|| {
                        format!("a string that is exactly ${{{expr}}} takes the value itself")
                    });
                    self.error_with_hint(
                        PlanErrorKind::InvalidValue,
                        path,
                        format!(
                            "${{{expr}}} is {}, which cannot be written into text",
                            describe(other)
                        ),
                        hint,
                    );
                    return None;
                }
            }
        }
        res.push_str(rest);
        Some(Value::String(res))
    }

    /// Substitutes every string inside `value` (map keys excepted). `json` allows whole-value
    /// replacement.
    fn substitute_value(&mut self, value: &mut Value, scope: &Scope<'_>, json: bool, path: &str) {
        // Iterative, so deeply nested input cannot overflow the stack.
        let mut stack: Vec<(&mut Value, String)> = vec![(value, path.to_owned())];
        while let Some((v, path)) = stack.pop() {
            match v {
                Value::String(s) => {
                    if let Some(new) = self.substitute(s, scope, json, &path) {
                        *v = new;
                    }
                }
                // Pushed in reverse, so errors come out in document order.
                Value::Array(items) => {
                    for (k, item) in items.iter_mut().enumerate().rev() {
                        stack.push((item, format!("{path}[{k}]")));
                    }
                }
                Value::Object(map) => {
                    for (key, item) in map.iter_mut().rev() {
                        stack.push((item, format!("{path}.{key}")));
                    }
                }
                Value::Null | Value::Bool(_) | Value::Number(_) => {}
            }
        }
    }

    /// Substitutes the references of one task held as a JSON map: `input` allows whole-value
    /// replacement, every other field is text.
    fn substitute_task(&mut self, task: &mut Map<String, Value>, scope: &Scope<'_>, path: &str) {
        for (key, value) in task.iter_mut() {
            let json = key == "input";
            self.substitute_value(value, scope, json, &format!("{path}.{key}"));
        }
    }
}

/// Returns the expression when `text` is exactly one reference `${...}`.
fn whole_reference(text: &str) -> Option<&str> {
    let inner = text.strip_prefix("${")?.strip_suffix('}')?;
    (!inner.contains('}') && !inner.contains("${")).then_some(inner)
}

fn is_param_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
}

/// Describes a JSON value for a message: its type and, when short, the value.
fn describe(value: &Value) -> String {
    let kind = match value {
        Value::Null => return "null".to_owned(),
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    };
    let text = value.to_string();
    if text.len() <= 40 && !matches!(value, Value::Array(_) | Value::Object(_)) {
        format!("{kind} {text}")
    } else {
        kind.to_owned()
    }
}

/// Expands a spec; the flat spec still holds literal `${` unescaped (it is what the compiler
/// validates), and the source map points its tasks back at the spec as written.
pub(crate) fn expand_inner(
    spec: PlanSpec,
    given: &BTreeMap<String, Value>,
    limits: &Limits,
) -> Result<(PlanSpec, SourceMap), PlanErrors> {
    let mut x = Expander { errors: Vec::new() };
    let params = x.params(&spec.params, given);
    let templates = x.templates(&spec.templates);
    if !x.errors.is_empty() {
        return Err(PlanErrors::from_vec(x.errors));
    }
    let scope = Scope {
        params: &params,
        item: None,
    };

    let mut name = Value::String(spec.name);
    x.substitute_value(&mut name, &scope, false, "name");
    let mut options = to_map(&spec.options);
    x.substitute_task(&mut options, &scope, "options");

    let mut tasks: Vec<Pending> = Vec::with_capacity(spec.tasks.len());
    // Reused to look for `$` in a task's JSON text.
    let mut text = Vec::new();
    let mut map = SourceMap {
        tasks: Vec::with_capacity(spec.tasks.len()),
        identity: true,
    };
    // Generator id → the ids of the tasks it made, and where the generator was declared.
    let mut generators: BTreeMap<String, (Vec<String>, usize)> = BTreeMap::new();
    for (i, task) in spec.tasks.into_iter().enumerate() {
        // Most tasks use no template, generate nothing and mention no `$`: expansion leaves them
        // as they are, so they skip the round trip through JSON values (five times slower than
        // the rest of compiling a large plan).
        if task.use_template.is_none()
            && task.for_each.is_none()
            && !mentions_dollar(&task, &mut text)
        {
            tasks.push(Pending::Ready(Box::new(task)));
            map.tasks.push(TaskOrigin {
                source: i,
                item: None,
                depends_on: None,
            });
            continue;
        }
        let path = format!("tasks[{i}]");
        let mut fields = to_map(&task);
        if let Some(Value::String(template)) = fields.remove("use") {
            match templates.get(template.as_str()) {
                Some(t) => merge_template(&mut fields, t),
                None => x.error_with_hint(
                    PlanErrorKind::UnknownReference,
                    format!("{path}.use"),
                    format!("unknown template {template:?}"),
                    did_you_mean(&template, templates.keys().copied()).or_else(|| {
                        Some(if templates.is_empty() {
                            "declare it under `templates:`".to_owned()
                        } else {
                            let names: Vec<&str> = templates.keys().copied().collect();
                            format!("declared templates: {}", names.join(", "))
                        })
                    }),
                ),
            }
        }
        let Some(mut list) = fields.remove("for_each") else {
            x.substitute_task(&mut fields, &scope, &path);
            tasks.push(Pending::Fields(fields));
            map.tasks.push(TaskOrigin {
                source: i,
                item: None,
                depends_on: None,
            });
            continue;
        };
        map.identity = false;
        x.substitute_value(&mut list, &scope, true, &format!("{path}.for_each"));
        let items = match list {
            Value::Array(items) => items,
            Value::String(_) if !x.errors.is_empty() => continue,
            other => {
                x.error_with_hint(
                    PlanErrorKind::InvalidValue,
                    format!("{path}.for_each"),
                    format!("for_each must be a list, got {}", describe(&other)),
                    Some(
                        "give a list ([a, b]) or a reference to a list param (${params.x})"
                            .to_owned(),
                    ),
                );
                continue;
            }
        };
        let raw_id = task.id.as_str();
        let id_names_item = raw_id.contains("${item") || raw_id.contains("${index}");
        let by_item = item_suffixes(&items);
        let mut made = Vec::with_capacity(items.len());
        let mut generator_id = None;
        for (k, item) in items.iter().enumerate() {
            let mut copy = fields.clone();
            let item_scope = Scope {
                params: &params,
                item: Some((item, k)),
            };
            let n_errors = x.errors.len();
            x.substitute_task(&mut copy, &item_scope, &path);
            if x.errors.len() > n_errors {
                // The same mistake would be reported once per item.
                break;
            }
            let mut id = match copy.get("id") {
                Some(Value::String(id)) => id.clone(),
                _ => String::new(),
            };
            if !id_names_item {
                generator_id.get_or_insert_with(|| id.clone());
                let suffix = match &by_item {
                    Some(suffixes) => suffixes[k].clone(),
                    None => k.to_string(),
                };
                id = format!("{id}-{suffix}");
                copy.insert("id".to_owned(), Value::String(id.clone()));
            }
            made.push(id.clone());
            tasks.push(Pending::Fields(copy));
            map.tasks.push(TaskOrigin {
                source: i,
                item: Some((k, id)),
                depends_on: None,
            });
            if tasks.len() > limits.max_tasks {
                break;
            }
        }
        let generator_id = generator_id.unwrap_or_else(|| {
            let mut id = Value::String(task.id.clone());
            if !id_names_item {
                x.substitute_value(&mut id, &scope, false, &format!("{path}.id"));
            }
            id.as_str().unwrap_or_default().to_owned()
        });
        if !id_names_item {
            generators.insert(generator_id, (made, i));
        }
        if tasks.len() > limits.max_tasks {
            break;
        }
    }
    if !map.identity && tasks.len() > limits.max_tasks {
        x.error(
            PlanErrorKind::TooLarge,
            "tasks",
            format!(
                "plan has more than {} tasks once for_each is expanded",
                limits.max_tasks
            ),
        );
    }
    if !x.errors.is_empty() {
        return Err(PlanErrors::from_vec(x.errors));
    }
    if !generators.is_empty() {
        let mut fields: Vec<Map<String, Value>> = tasks
            .into_iter()
            .map(|task| match task {
                Pending::Ready(task) => to_map(&task),
                Pending::Fields(fields) => fields,
            })
            .collect();
        x.fan_in(&mut fields, &mut map, &generators);
        tasks = fields.into_iter().map(Pending::Fields).collect();
    }

    let mut flat = PlanSpec {
        name: match name {
            Value::String(s) => s,
            other => other.to_string(),
        },
        params: BTreeMap::new(),
        templates: BTreeMap::new(),
        options: from_map(options, "options", &mut x.errors).unwrap_or_default(),
        tasks: Vec::with_capacity(tasks.len()),
    };
    for (t, task) in tasks.into_iter().enumerate() {
        match task {
            Pending::Ready(task) => flat.tasks.push(*task),
            Pending::Fields(fields) => {
                let path = format!("tasks[{}]", map.tasks[t].source);
                if let Some(task) = from_map::<TaskSpec>(fields, &path, &mut x.errors) {
                    flat.tasks.push(task);
                }
            }
        }
    }
    if !x.errors.is_empty() {
        return Err(PlanErrors::from_vec(x.errors));
    }
    Ok((flat, map))
}

/// Returns the id suffix of each item when every item is a string or integer usable in an id
/// and no two are the same; `None` means ids take the item's index instead.
fn item_suffixes(items: &[Value]) -> Option<Vec<String>> {
    let mut res = Vec::with_capacity(items.len());
    let mut seen = std::collections::HashSet::with_capacity(items.len());
    for item in items {
        let text = match item {
            Value::String(s) => s.clone(),
            Value::Number(n) if n.is_i64() || n.is_u64() => n.to_string(),
            _ => return None,
        };
        let usable = !text.is_empty()
            && text
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
        if !usable || !seen.insert(text.clone()) {
            return None;
        }
        res.push(text);
    }
    Some(res)
}

/// Starts a task from a template: fields the task does not give are taken from the template, and
/// `input` objects merge (the task's keys win).
fn merge_template(task: &mut Map<String, Value>, template: &Map<String, Value>) {
    for (key, value) in template {
        match task.get_mut(key) {
            None => {
                task.insert(key.clone(), value.clone());
            }
            Some(Value::Object(own)) if key == "input" => {
                if let Value::Object(base) = value {
                    for (k, v) in base {
                        own.entry(k.clone()).or_insert_with(|| v.clone());
                    }
                }
            }
            Some(_) => {}
        }
    }
}

impl Expander {
    /// Checks every template (fields it may not have, fields no task has) and returns them by
    /// name.
    fn templates<'t>(
        &mut self,
        templates: &'t BTreeMap<String, TemplateSpec>,
    ) -> BTreeMap<&'t str, &'t Map<String, Value>> {
        let mut res = BTreeMap::new();
        for (name, template) in templates {
            let path = format!("templates.{name}");
            let mut ok = true;
            for field in ["id", "use", "for_each"] {
                if template.0.contains_key(field) {
                    ok = false;
                    self.error(
                        PlanErrorKind::Parse,
                        format!("{path}.{field}"),
                        format!("a template cannot have `{field}` (give it on the tasks that use the template)"),
                    );
                }
            }
            {
                let mut probe = template.0.clone();
                for field in ["use", "for_each"] {
                    probe.remove(field);
                }
                probe.insert("id".to_owned(), Value::String(name.clone()));
                let n_errors = self.errors.len();
                from_map::<TaskSpec>(probe, &path, &mut self.errors);
                ok &= self.errors.len() == n_errors;
            }
            if ok {
                res.insert(name.as_str(), &template.0);
            }
        }
        res
    }

    /// Makes references to a `for_each` task's id stand for every task it made: a dependency on
    /// it becomes a dependency on each of them, a relationship to it a relationship to each.
    fn fan_in(
        &mut self,
        tasks: &mut [Map<String, Value>],
        map: &mut SourceMap,
        generators: &BTreeMap<String, (Vec<String>, usize)>,
    ) {
        for (t, task) in tasks.iter_mut().enumerate() {
            let path = format!("tasks[{}]", map.tasks[t].source);
            if let Some(Value::String(id)) = task.get("id")
                && let Some((_, at)) = generators.get(id)
            {
                self.error(
                    PlanErrorKind::DuplicateId,
                    format!("{path}.id"),
                    format!("task id {id:?} is also the id of the for_each task at tasks[{at}]"),
                );
            }
            if let Some(Value::Array(deps)) = task.get_mut("depends_on") {
                let mut res = Vec::with_capacity(deps.len());
                let mut positions = Vec::with_capacity(deps.len());
                for (j, dep) in deps.drain(..).enumerate() {
                    match dep.as_str().and_then(|d| generators.get(d)) {
                        Some((made, _)) => {
                            res.extend(made.iter().map(|id| Value::String(id.clone())));
                            positions.extend(std::iter::repeat_n(j, made.len()));
                        }
                        None => {
                            res.push(dep);
                            positions.push(j);
                        }
                    }
                }
                *deps = res;
                map.tasks[t].depends_on = Some(positions);
            }
            if let Some(Value::Array(relationships)) = task.get_mut("relationships") {
                let mut res = Vec::with_capacity(relationships.len());
                for rel in relationships.drain(..) {
                    let made = rel
                        .get("target")
                        .and_then(Value::as_str)
                        .and_then(|target| generators.get(target));
                    match made {
                        Some((made, _)) => {
                            for id in made {
                                let mut copy = rel.clone();
                                copy["target"] = Value::String(id.clone());
                                res.push(copy);
                            }
                        }
                        None => res.push(rel),
                    }
                }
                *relationships = res;
            }
            if let Some(Value::Object(route)) = task.get_mut("route") {
                let mut lists: Vec<&mut Value> = Vec::new();
                for (key, value) in route.iter_mut() {
                    match (key.as_str(), value) {
                        ("cases", Value::Object(cases)) => lists.extend(cases.values_mut()),
                        ("default", default) => lists.push(default),
                        _ => {}
                    }
                }
                for list in lists {
                    if let Value::Array(targets) = list {
                        let mut res = Vec::with_capacity(targets.len());
                        for target in targets.drain(..) {
                            match target.as_str().and_then(|d| generators.get(d)) {
                                Some((made, _)) => {
                                    res.extend(made.iter().map(|id| Value::String(id.clone())));
                                }
                                None => res.push(target),
                            }
                        }
                        *targets = res;
                    }
                }
            }
            if let Some(Value::String(fallback)) = task.get("fallback")
                && let Some((made, _)) = generators.get(fallback)
            {
                self.error(
                    PlanErrorKind::Contradiction,
                    format!("{path}.fallback"),
                    format!(
                        "fallback names the for_each task {fallback:?}, which stands for {} tasks",
                        made.len()
                    ),
                );
            }
        }
    }
}

/// A task of the flat spec being built: untouched, or as fields still to be read back.
enum Pending {
    Ready(Box<TaskSpec>),
    Fields(Map<String, Value>),
}

/// Returns true when the JSON text of `value` holds a `$` (serde_json never escapes it), using
/// `buf` as scratch space.
fn mentions_dollar<T: serde::Serialize>(value: &T, buf: &mut Vec<u8>) -> bool {
    buf.clear();
    match serde_json::to_writer(&mut *buf, value) {
        Ok(()) => buf.contains(&b'$'),
        // Cannot happen for spec types; take the careful path if it ever does.
        Err(_) => true,
    }
}

fn to_map<T: serde::Serialize>(value: &T) -> Map<String, Value> {
    match serde_json::to_value(value) {
        Ok(Value::Object(map)) => map,
        // Spec structs always serialise to a map; anything else would be a bug caught by tests.
        _ => Map::new(),
    }
}

fn from_map<T: serde::de::DeserializeOwned>(
    map: Map<String, Value>,
    path: &str,
    errors: &mut Vec<PlanError>,
) -> Option<T> {
    match serde_path_to_error::deserialize(Value::Object(map)) {
        Ok(value) => Some(value),
        Err(e) => {
            let inner = e.path().to_string();
            let path = if inner == "." {
                path.to_owned()
            } else {
                format!("{path}.{inner}")
            };
            let message = e.inner().to_string();
            let mut error = PlanError::new(PlanErrorKind::Parse, path, &message);
            error.hint = unknown_name_hint(&message);
            errors.push(error);
            None
        }
    }
}

/// Writes every literal `${` of a flat spec as `$${`, so expanding it again changes nothing: for
/// a spec rebuilt from a compiled plan (whose strings hold their final text) before it is
/// compiled again.
///
/// # Errors
///
/// Only if the escaped spec no longer reads as a spec, which escaping cannot cause.
pub fn escape_references(spec: PlanSpec) -> Result<PlanSpec, PlanErrors> {
    if !mentions_dollar(&spec, &mut Vec::new()) {
        return Ok(spec);
    }
    let mut value = match serde_json::to_value(&spec) {
        Ok(v) => v,
        Err(_) => return Ok(spec),
    };
    let mut stack = vec![&mut value];
    let mut changed = false;
    while let Some(v) = stack.pop() {
        match v {
            Value::String(s) if s.contains("${") => {
                *s = s.replace("${", "$${");
                changed = true;
            }
            Value::Array(items) => stack.extend(items.iter_mut()),
            Value::Object(map) => stack.extend(map.values_mut()),
            _ => {}
        }
    }
    if !changed {
        return Ok(spec);
    }
    let mut errors = Vec::new();
    match value {
        Value::Object(map) => {
            from_map(map, "", &mut errors).ok_or_else(|| PlanErrors::from_vec(errors))
        }
        _ => Ok(spec),
    }
}
