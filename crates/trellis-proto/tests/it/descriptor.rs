//! The embedded descriptor set is what reflection serves: it decodes, holds the three services
//! with their rpcs, and documents every element, so an undocumented addition fails here.

use std::collections::{BTreeSet, HashMap};

use prost::Message;
use prost_types::{DescriptorProto, EnumDescriptorProto, FileDescriptorProto, FileDescriptorSet};

// Field numbers of `google/protobuf/descriptor.proto`, used in `SourceCodeInfo.Location.path`.
const FILE_MESSAGE_TYPE: i32 = 4;
const FILE_ENUM_TYPE: i32 = 5;
const FILE_SERVICE: i32 = 6;
const MESSAGE_FIELD: i32 = 2;
const MESSAGE_NESTED_TYPE: i32 = 3;
const MESSAGE_ENUM_TYPE: i32 = 4;
const MESSAGE_ONEOF_DECL: i32 = 8;
const ENUM_VALUE: i32 = 2;
const SERVICE_METHOD: i32 = 2;

fn descriptor_set() -> FileDescriptorSet {
    FileDescriptorSet::decode(trellis_proto::FILE_DESCRIPTOR_SET)
        .expect("the embedded descriptor set decodes")
}

fn index(idx: usize) -> i32 {
    i32::try_from(idx).expect("descriptor lists are far shorter than i32::MAX")
}

#[test]
fn services_have_their_rpcs() {
    let expected: [(&str, &[&str]); 4] = [
        (
            "Coordinator",
            &[
                "StartExecution",
                "PauseExecution",
                "ResumeExecution",
                "CancelExecution",
                "RetryExecution",
                "GetExecution",
                "ListExecutions",
                "ObserveExecution",
                "RunExecution",
                "GetExecutionGraph",
                "GetTaskLogs",
                "GetTaskOutput",
                "AnswerQuestion",
                "ListWorkers",
                "CheckpointExecution",
                "GetCluster",
                "PauseFleet",
                "ResumeFleet",
                "ListPauses",
                "DrainWorker",
            ],
        ),
        ("Planner", &["CompilePlan", "AnalyzePlan"]),
        (
            "Backlog",
            &[
                "CreateProject",
                "ListProjects",
                "SetGroupingWeights",
                "AddTask",
                "GetTask",
                "ListTasks",
                "EditTask",
                "BlockTask",
                "UnblockTask",
                "CheckTask",
                "CreateList",
                "GetList",
                "ListLists",
                "MoveTask",
                "RunList",
                "ListRuns",
                "PutRule",
                "ListRules",
                "DeleteRule",
                "SuggestGroups",
                "ListSuggestions",
                "ResolveSuggestion",
                "AddSink",
                "ListSinks",
                "RemoveSink",
                "ListDeliveries",
                "PutTemplate",
                "ListTemplates",
                "DeleteTemplate",
            ],
        ),
        (
            "CheckpointStore",
            &[
                "CreateCheckpoint",
                "GetCheckpoint",
                "RestoreCheckpoint",
                "ListCheckpoints",
                "PruneCheckpoints",
                "QueryTaskInstances",
                "GetExecutionRecord",
                "ListExecutionRecords",
                "ListTaskLogs",
            ],
        ),
    ];
    let descriptor_set = descriptor_set();
    let services: HashMap<&str, BTreeSet<&str>> = descriptor_set
        .file
        .iter()
        .filter(|file| file.package() == "trellis.v1")
        .flat_map(|file| &file.service)
        .map(|service| {
            (
                service.name(),
                service.method.iter().map(|m| m.name()).collect(),
            )
        })
        .collect();
    assert_eq!(services.len(), expected.len(), "services: {services:?}");
    for (service_name, rpc_names) in expected {
        let actual = services
            .get(service_name)
            .unwrap_or_else(|| panic!("service {service_name} is missing"));
        let expected: BTreeSet<&str> = rpc_names.iter().copied().collect();
        assert_eq!(actual, &expected, "rpcs of {service_name}");
    }
    for streamed in ["ObserveExecution", "RunExecution"] {
        let method = descriptor_set
            .file
            .iter()
            .flat_map(|file| &file.service)
            .flat_map(|service| &service.method)
            .find(|method| method.name() == streamed)
            .unwrap_or_else(|| panic!("{streamed} exists"));
        assert!(method.server_streaming(), "{streamed} streams events");
    }
}

#[test]
fn every_element_is_documented() {
    let mut undocumented = Vec::new();
    for file in &descriptor_set().file {
        check_file(file, &mut undocumented);
    }
    assert!(
        undocumented.is_empty(),
        "these elements need a leading `//` comment in their .proto file:\n{}",
        undocumented.join("\n")
    );
}

#[test]
fn enums_start_with_unspecified() {
    // buf's STANDARD lint asks for this too; checked here for people without buf.
    let mut wrong = Vec::new();
    for file in &descriptor_set().file {
        let mut enums: Vec<(String, &EnumDescriptorProto)> = file
            .enum_type
            .iter()
            .map(|e| (e.name().to_owned(), e))
            .collect();
        let mut stack: Vec<(String, &DescriptorProto)> = file
            .message_type
            .iter()
            .map(|m| (m.name().to_owned(), m))
            .collect();
        while let Some((name, message)) = stack.pop() {
            enums.extend(
                message
                    .enum_type
                    .iter()
                    .map(|e| (format!("{name}.{}", e.name()), e)),
            );
            stack.extend(
                message
                    .nested_type
                    .iter()
                    .map(|m| (format!("{name}.{}", m.name()), m)),
            );
        }
        for (name, enum_type) in enums {
            let first = enum_type.value.first().expect("an enum has values");
            if first.number() != 0 || !first.name().ends_with("_UNSPECIFIED") {
                wrong.push(name);
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "enums without `_UNSPECIFIED = 0`: {wrong:?}"
    );
}

/// Leading comments of one file, by location path.
struct Comments(HashMap<Vec<i32>, String>);

impl Comments {
    fn of(file: &FileDescriptorProto) -> Comments {
        let locations = file
            .source_code_info
            .as_ref()
            .expect("build.rs keeps source info")
            .location
            .iter();
        Comments(
            locations
                .filter(|location| !location.leading_comments().trim().is_empty())
                .map(|location| {
                    (
                        location.path.clone(),
                        location.leading_comments().to_owned(),
                    )
                })
                .collect(),
        )
    }

    fn check(&self, path: &[i32], name: &str, undocumented: &mut Vec<String>) {
        if !self.0.contains_key(path) {
            undocumented.push(name.to_owned());
        }
    }
}

fn check_file(file: &FileDescriptorProto, undocumented: &mut Vec<String>) {
    let comments = Comments::of(file);
    let prefix = file.package();
    for (message_idx, message) in file.message_type.iter().enumerate() {
        check_message(
            &comments,
            vec![FILE_MESSAGE_TYPE, index(message_idx)],
            &format!("{prefix}.{}", message.name()),
            message,
            undocumented,
        );
    }
    for (enum_idx, enum_type) in file.enum_type.iter().enumerate() {
        check_enum(
            &comments,
            vec![FILE_ENUM_TYPE, index(enum_idx)],
            &format!("{prefix}.{}", enum_type.name()),
            enum_type,
            undocumented,
        );
    }
    for (service_idx, service) in file.service.iter().enumerate() {
        let path = vec![FILE_SERVICE, index(service_idx)];
        let name = format!("{prefix}.{}", service.name());
        comments.check(&path, &name, undocumented);
        for (method_idx, method) in service.method.iter().enumerate() {
            let mut method_path = path.clone();
            method_path.extend([SERVICE_METHOD, index(method_idx)]);
            comments.check(
                &method_path,
                &format!("{name}.{}", method.name()),
                undocumented,
            );
        }
    }
}

fn check_message(
    comments: &Comments,
    path: Vec<i32>,
    name: &str,
    message: &DescriptorProto,
    undocumented: &mut Vec<String>,
) {
    comments.check(&path, name, undocumented);
    let child = |kind: i32, idx: usize| {
        let mut child_path = path.clone();
        child_path.extend([kind, index(idx)]);
        child_path
    };
    for (field_idx, field) in message.field.iter().enumerate() {
        let field_name = format!("{name}.{}", field.name());
        comments.check(&child(MESSAGE_FIELD, field_idx), &field_name, undocumented);
    }
    // proto3 `optional` fields get a synthetic oneof the author never wrote; only real ones count.
    let synthetic_oneofs: BTreeSet<i32> = message
        .field
        .iter()
        .filter(|field| field.proto3_optional())
        .filter_map(|field| field.oneof_index)
        .collect();
    for (oneof_idx, oneof) in message.oneof_decl.iter().enumerate() {
        if !synthetic_oneofs.contains(&index(oneof_idx)) {
            let oneof_name = format!("{name}.{}", oneof.name());
            comments.check(
                &child(MESSAGE_ONEOF_DECL, oneof_idx),
                &oneof_name,
                undocumented,
            );
        }
    }
    for (nested_idx, nested) in message.nested_type.iter().enumerate() {
        // Map fields are backed by generated `*Entry` messages with nothing to document.
        if nested
            .options
            .as_ref()
            .is_some_and(|options| options.map_entry())
        {
            continue;
        }
        let nested_name = format!("{name}.{}", nested.name());
        check_message(
            comments,
            child(MESSAGE_NESTED_TYPE, nested_idx),
            &nested_name,
            nested,
            undocumented,
        );
    }
    for (enum_idx, enum_type) in message.enum_type.iter().enumerate() {
        let enum_name = format!("{name}.{}", enum_type.name());
        check_enum(
            comments,
            child(MESSAGE_ENUM_TYPE, enum_idx),
            &enum_name,
            enum_type,
            undocumented,
        );
    }
}

fn check_enum(
    comments: &Comments,
    path: Vec<i32>,
    name: &str,
    enum_type: &EnumDescriptorProto,
    undocumented: &mut Vec<String>,
) {
    comments.check(&path, name, undocumented);
    for (value_idx, value) in enum_type.value.iter().enumerate() {
        let mut value_path = path.clone();
        value_path.extend([ENUM_VALUE, index(value_idx)]);
        comments.check(
            &value_path,
            &format!("{name}.{}", value.name()),
            undocumented,
        );
    }
}
