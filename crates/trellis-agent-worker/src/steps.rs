//! The state merge of durable steps (seed 002): maps merge, the `messages` and `trace` lists
//! append, every other field replaces.

use serde_json::Value;

/// Fields whose lists append instead of replacing.
const APPENDED_LISTS: [&str; 2] = ["messages", "trace"];

/// Merges `update` into `state`. A non-object update replaces the whole state.
pub(crate) fn merge(state: &mut Value, update: Value) {
    match (state, update) {
        (Value::Object(state), Value::Object(update)) => {
            for (key, value) in update {
                match state.get_mut(&key) {
                    Some(Value::Array(existing)) if APPENDED_LISTS.contains(&key.as_str()) => {
                        match value {
                            Value::Array(items) => existing.extend(items),
                            other => existing.push(other),
                        }
                    }
                    Some(existing @ Value::Object(_)) if value.is_object() => {
                        merge(existing, value)
                    }
                    _ => {
                        state.insert(key, value);
                    }
                }
            }
        }
        (state, update) => *state = update,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    fn check(state: serde_json::Value, update: serde_json::Value, expected: serde_json::Value) {
        let mut state = state;
        super::merge(&mut state, update);
        assert_eq!(state, expected);
    }

    #[test]
    fn maps_merge_lists_append_others_replace() {
        check(json!({}), json!({"a": 1}), json!({"a": 1}));
        check(
            json!({"a": 1, "b": 2}),
            json!({"a": 3}),
            json!({"a": 3, "b": 2}),
        );
        check(
            json!({"slots": {"x": 1}}),
            json!({"slots": {"y": 2}}),
            json!({"slots": {"x": 1, "y": 2}}),
        );
        check(
            json!({"messages": [1], "trace": ["a"], "other": [1]}),
            json!({"messages": [2, 3], "trace": "b", "other": [2]}),
            json!({"messages": [1, 2, 3], "trace": ["a", "b"], "other": [2]}),
        );
        check(json!({"a": 1}), json!(7), json!(7));
        check(json!(null), json!({"a": 1}), json!({"a": 1}));
    }
}
