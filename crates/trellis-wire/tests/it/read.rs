//! Read projections on the wire: task states map one to one onto their wire values.

use trellis_core::record::TaskState;
use trellis_proto::v1;
use trellis_wire::read;

#[test]
fn task_states_map_one_to_one() {
    let mut seen = std::collections::BTreeSet::new();
    for state in TaskState::ALL {
        let wire = read::task_state_to_proto(state);
        assert!(seen.insert(wire), "{state:?} shares wire value {wire}");
        assert_eq!(read::task_state_from_proto(wire), Ok(state));
        assert_eq!(
            v1::TaskState::try_from(wire).map(|s| s.as_str_name().to_ascii_lowercase()),
            Ok(format!("task_state_{}", state.as_str()))
        );
    }
    assert!(read::task_state_from_proto(0).is_err());
    assert!(read::task_state_from_proto(99).is_err());
}
