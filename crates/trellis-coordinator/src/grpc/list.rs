//! `ListExecutions`: a page of the read model with what the coordinators hold laid over it, or
//! every coordinator's memory when there is no read model to read.

use tonic::{Response, Status};
use trellis_grpc::access::Scope;
use trellis_proto::v1;

use super::{CoordinatorService, status};
use crate::checkpoints::StoreClient;
use crate::executor;
use crate::forward;
use crate::turn::{self, Answer};

impl CoordinatorService {
    /// Lists executions from the read model, paged: what every coordinator has run, finished
    /// ones included, across restarts.
    pub(super) async fn list_from_store(
        &self,
        store: &StoreClient,
        scope: &Scope,
        request: v1::ListExecutionsRequest,
    ) -> Result<v1::ListExecutionsResponse, Status> {
        let namespace = match scope {
            Scope::All => request.namespace,
            Scope::Namespace(own)
                if request.namespace.is_empty() || *request.namespace == **own =>
            {
                own.to_string()
            }
            // Another namespace than the token's: nothing the caller may see.
            Scope::Namespace(_) => {
                return Ok(v1::ListExecutionsResponse::default());
            }
        };
        let response = store
            .list(v1::ListExecutionRecordsRequest {
                states: request.states,
                name_contains: request.name_contains,
                labels: request.labels,
                created_after_unix_ms: request.created_after_unix_ms,
                created_before_unix_ms: request.created_before_unix_ms,
                page: request.page,
                namespace,
            })
            .await?;
        Ok(v1::ListExecutionsResponse {
            executions: response.executions,
            page: response.page,
        })
    }

    /// Lists the executions in memory here and, unless the call was forwarded, at every other
    /// coordinator, as the request filters them, newest first, unpaged.
    pub(super) async fn in_memory(
        &self,
        scope: Scope,
        metadata: &tonic::metadata::MetadataMap,
        request: &v1::ListExecutionsRequest,
    ) -> Result<Vec<v1::Execution>, Status> {
        let answer = self
            .executor
            .ask(turn::Request::List { scope })
            .await
            .map_err(status)?;
        let mut executions = expect!(answer, Answer::Executions(executions) => executions)?;
        if !forward::is_forwarded(metadata) {
            let view = self.router.view();
            let asks = view
                .other_addresses(self.router.me())
                .into_iter()
                .map(|(id, address)| {
                    let request = self.router.outgoing(metadata, request.clone());
                    async move {
                        let mut client = self.router.client(&address)?;
                        client
                            .list_executions(request)
                            .await
                            .map(Response::into_inner)
                            .map_err(|status| {
                                Status::unavailable(format!(
                                    "coordinator {id} at {address} did not list its executions: {}",
                                    status.message()
                                ))
                            })
                    }
                });
            for answer in futures::future::join_all(asks).await {
                executions.extend(answer?.executions);
            }
        }
        Ok(filter_and_sort(executions, request))
    }
}

/// Returns one page of `executions` (newest first) after the request's page token.
pub(super) fn page(
    mut executions: Vec<v1::Execution>,
    request: &v1::ListExecutionsRequest,
) -> v1::ListExecutionsResponse {
    let (page_size, after) = page_of(request.page.as_ref());
    if let Some(after) = after {
        executions.retain(|e| e.execution_id.as_str() < after.as_str());
    }
    let next =
        (executions.len() > page_size).then(|| executions[page_size - 1].execution_id.clone());
    executions.truncate(page_size);
    v1::ListExecutionsResponse {
        executions,
        page: next.map(|next_page_token| v1::PageResponse { next_page_token }),
    }
}

/// Lays what the coordinators hold over a page of the read model, which lags the log by a
/// moment: executions in memory that fall within the page's range replace their stored rows
/// (their state is newer) or join the page (started since the store last wrote).
pub(super) fn merge(
    stored: v1::ListExecutionsResponse,
    live: Vec<v1::Execution>,
    request: &v1::ListExecutionsRequest,
) -> v1::ListExecutionsResponse {
    let (page_size, after) = page_of(request.page.as_ref());
    let next = stored
        .page
        .map(|p| p.next_page_token)
        .filter(|t| !t.is_empty());
    // Ids below the page's last one belong to later pages.
    let floor = next
        .as_ref()
        .and_then(|_| stored.executions.last().map(|e| e.execution_id.clone()));
    let mut executions = stored.executions;
    for execution in live {
        let above_floor = floor
            .as_ref()
            .is_none_or(|floor| execution.execution_id >= *floor);
        let before_token = after
            .as_ref()
            .is_none_or(|after| execution.execution_id < *after);
        if !(above_floor && before_token) {
            continue;
        }
        match executions
            .iter_mut()
            .find(|e| e.execution_id == execution.execution_id)
        {
            Some(row) => *row = execution,
            None => executions.push(execution),
        }
    }
    executions.sort_by(|a, b| b.execution_id.cmp(&a.execution_id));
    let next = if executions.len() > page_size {
        executions.truncate(page_size);
        executions.last().map(|e| e.execution_id.clone())
    } else {
        next
    };
    v1::ListExecutionsResponse {
        executions,
        page: next.map(|next_page_token| v1::PageResponse { next_page_token }),
    }
}

/// Keeps the executions a list request asks for, newest first, each once.
fn filter_and_sort(
    mut executions: Vec<v1::Execution>,
    request: &v1::ListExecutionsRequest,
) -> Vec<v1::Execution> {
    executions.retain(|e| {
        (request.namespace.is_empty() || e.namespace == request.namespace)
            && (request.states.is_empty() || request.states.contains(&e.state))
            && name_matches(&e.name, &request.name_contains)
            && request
                .labels
                .iter()
                .all(|(k, v)| e.labels.get(k) == Some(v))
            && (request.created_after_unix_ms == 0
                || e.created_at_unix_ms >= request.created_after_unix_ms)
            && (request.created_before_unix_ms == 0
                || e.created_at_unix_ms < request.created_before_unix_ms)
    });
    executions.sort_by(|a, b| b.execution_id.cmp(&a.execution_id));
    executions.dedup_by(|a, b| a.execution_id == b.execution_id);
    executions
}

/// Whether plan name `name` contains `needle`, ignoring case, as the read model's filter does;
/// an empty needle matches every name.
fn name_matches(name: &str, needle: &str) -> bool {
    needle.is_empty() || name.to_lowercase().contains(&needle.to_lowercase())
}

/// The page size (default 100, at most 1,000) and the id the page starts after.
fn page_of(page: Option<&v1::PageRequest>) -> (usize, Option<String>) {
    let size = page.map_or(100, |p| match p.page_size {
        0 => 100,
        n => n.min(1000),
    });
    let after = page
        .map(|p| p.page_token.clone())
        .filter(|token| !token.is_empty());
    (size as usize, after)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn execution(id: &str, state: v1::ExecutionState) -> v1::Execution {
        v1::Execution {
            execution_id: id.to_owned(),
            state: state as i32,
            ..Default::default()
        }
    }

    fn ids(response: &v1::ListExecutionsResponse) -> Vec<&str> {
        response
            .executions
            .iter()
            .map(|e| e.execution_id.as_str())
            .collect()
    }

    fn request(page_size: u32, page_token: &str) -> v1::ListExecutionsRequest {
        v1::ListExecutionsRequest {
            page: Some(v1::PageRequest {
                page_size,
                page_token: page_token.to_owned(),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn pages_run_newest_first_and_end_without_a_token() {
        let all: Vec<v1::Execution> = ["e", "d", "c", "b", "a"]
            .iter()
            .map(|id| execution(id, v1::ExecutionState::Completed))
            .collect();
        let first = page(all.clone(), &request(2, ""));
        assert_eq!(ids(&first), ["e", "d"]);
        let token = first.page.as_ref().map(|p| p.next_page_token.clone());
        assert_eq!(token.as_deref(), Some("d"));
        let third = page(all, &request(2, "b"));
        assert_eq!(ids(&third), ["a"]);
        assert!(third.page.is_none());
    }

    #[test]
    fn the_name_filter_ignores_case() {
        let named = |id: &str, name: &str| v1::Execution {
            name: name.to_owned(),
            ..execution(id, v1::ExecutionState::Running)
        };
        let all = vec![
            named("c", "Nightly Build"),
            named("b", "build-docs"),
            named("a", "deploy"),
        ];
        let filtered = |needle: &str| {
            let request = v1::ListExecutionsRequest {
                name_contains: needle.to_owned(),
                ..Default::default()
            };
            filter_and_sort(all.clone(), &request)
                .into_iter()
                .map(|e| e.execution_id)
                .collect::<Vec<_>>()
        };
        assert_eq!(filtered("BUILD"), ["c", "b"]);
        assert_eq!(filtered("nightly b"), ["c"]);
        assert_eq!(filtered(""), ["c", "b", "a"]);
        assert!(filtered("builds").is_empty());
    }

    #[test]
    fn live_executions_overlay_their_page_of_the_read_model() {
        // The store has d, c (a full page, more after c) and lags: b is running, e just started.
        let stored = v1::ListExecutionsResponse {
            executions: vec![
                execution("d", v1::ExecutionState::Running),
                execution("c", v1::ExecutionState::Completed),
            ],
            page: Some(v1::PageResponse {
                next_page_token: "c".to_owned(),
            }),
        };
        let live = vec![
            execution("e", v1::ExecutionState::Running),
            execution("d", v1::ExecutionState::Completed),
            execution("b", v1::ExecutionState::Running),
        ];
        let merged = merge(stored, live, &request(2, ""));
        // e joins, d's newer state wins, b belongs to a later page; the page stays two long.
        assert_eq!(ids(&merged), ["e", "d"]);
        assert_eq!(
            merged.executions[1].state,
            v1::ExecutionState::Completed as i32
        );
        assert_eq!(merged.page.map(|p| p.next_page_token).as_deref(), Some("d"));
    }
}
