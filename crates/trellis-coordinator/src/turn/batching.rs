//! A turn's assignments as task messages: the assignments of one queue's lane share a message,
//! up to a limit per queue the worker registry sets and [`BATCH_BYTES`]; an assignment that
//! avoids a worker goes alone, so the worker it avoids hands back only it.

use std::collections::HashMap;

use trellis_proto::subjects::BATCH_BYTES;

use super::Assign;

/// Groups `assignments` into messages: per queue and lane in dispatch order, runs of at most
/// `limit(queue)` assignments and [`BATCH_BYTES`] (an assignment larger than that alone); the
/// lanes in the order their first assignment came. A lane's order is kept, which is the order
/// its consumer hands tasks out in; the order between lanes never mattered (each has its own
/// consumer).
pub fn messages(
    assignments: Vec<Assign>,
    mut limit: impl FnMut(&str) -> usize,
) -> Vec<Vec<Assign>> {
    let mut messages: Vec<Vec<Assign>> = Vec::new();
    // Per lane: the message being filled (an index into `messages`), its bytes, and the limit.
    let mut open: HashMap<(String, bool), (usize, usize, usize)> = HashMap::new();
    for assign in assignments {
        if assign.alone || assign.offer {
            messages.push(vec![assign]);
            continue;
        }
        let size = assign.payload.len();
        let lane = (assign.queue.clone(), assign.fast);
        let limit = match open.get(&lane) {
            Some(&(_, _, limit)) => limit,
            None => limit(&assign.queue).max(1),
        };
        match open.get_mut(&lane) {
            Some((at, bytes, _)) if messages[*at].len() < limit && *bytes + size <= BATCH_BYTES => {
                *bytes += size;
                messages[*at].push(assign);
            }
            _ => {
                open.insert(lane, (messages.len(), size, limit));
                messages.push(vec![assign]);
            }
        }
    }
    messages
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use trellis_core::ids::{ExecutionId, TaskInstanceId};
    use trellis_telemetry::propagation::Context;

    use super::*;

    fn assign(queue: &str, fast: bool, n: u32, size: usize) -> Assign {
        Assign {
            queue: queue.to_owned(),
            fast,
            alone: false,
            offer: false,
            msg_id: format!("{queue}-{fast}-{n}"),
            payload: Bytes::from(vec![0u8; size]),
            trace: Context::new(),
            execution: ExecutionId::derived(0, 1),
            instance: TaskInstanceId::derived(0, u128::from(n)),
            attempt: n,
        }
    }

    fn ids(messages: &[Vec<Assign>]) -> Vec<Vec<&str>> {
        messages
            .iter()
            .map(|message| message.iter().map(|a| a.msg_id.as_str()).collect())
            .collect()
    }

    #[test]
    fn a_lane_shares_messages_up_to_its_queues_limit_in_order() {
        let assignments = vec![
            assign("a", false, 1, 10),
            assign("b", false, 1, 10),
            assign("a", false, 2, 10),
            assign("a", true, 1, 10),
            assign("a", false, 3, 10),
            assign("b", false, 2, 10),
        ];
        let messages = messages(assignments, |queue| if queue == "a" { 2 } else { 5 });
        assert_eq!(
            ids(&messages),
            [
                vec!["a-false-1", "a-false-2"],
                vec!["b-false-1", "b-false-2"],
                vec!["a-true-1"],
                vec!["a-false-3"],
            ]
        );
    }

    #[test]
    fn a_limit_of_one_sends_each_alone() {
        let assignments = (1..=3).map(|n| assign("a", false, n, 10)).collect();
        assert_eq!(messages(assignments, |_| 1).len(), 3);
        let assignments = (1..=3).map(|n| assign("a", false, n, 10)).collect();
        assert_eq!(messages(assignments, |_| 0).len(), 3, "a limit of 0 is 1");
    }

    #[test]
    fn an_assignment_that_avoids_a_worker_goes_alone() {
        let mut avoiding = assign("a", false, 2, 10);
        avoiding.alone = true;
        let assignments = vec![
            assign("a", false, 1, 10),
            avoiding,
            assign("a", false, 3, 10),
        ];
        assert_eq!(
            ids(&messages(assignments, |_| 64)),
            [vec!["a-false-1", "a-false-3"], vec!["a-false-2"]]
        );
    }

    #[test]
    fn a_message_holds_at_most_batch_bytes() {
        let third = BATCH_BYTES / 3;
        let assignments = vec![
            assign("a", false, 1, third),
            assign("a", false, 2, third),
            assign("a", false, 3, third),
            assign("a", false, 4, third),
            assign("a", false, 5, BATCH_BYTES + 1),
            assign("a", false, 6, 1),
        ];
        assert_eq!(
            ids(&messages(assignments, |_| 64)),
            [
                vec!["a-false-1", "a-false-2", "a-false-3"],
                vec!["a-false-4"],
                vec!["a-false-5"],
                vec!["a-false-6"],
            ]
        );
    }
}
