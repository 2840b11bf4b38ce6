//! The generated Rust API other crates build on: a tonic client and server per service.
//! Naming the types is the test; it stops compiling if generation is switched off or renamed.

use trellis_proto::v1::{
    checkpoint_store_client::CheckpointStoreClient, checkpoint_store_server::CheckpointStoreServer,
    coordinator_client::CoordinatorClient, coordinator_server::CoordinatorServer,
    planner_client::PlannerClient, planner_server::PlannerServer,
};

#[test]
fn clients_and_servers_are_generated() {
    let type_names = [
        std::any::type_name::<CoordinatorClient<tonic::transport::Channel>>(),
        std::any::type_name::<PlannerClient<tonic::transport::Channel>>(),
        std::any::type_name::<CheckpointStoreClient<tonic::transport::Channel>>(),
        std::any::type_name::<CoordinatorServer<()>>(),
        std::any::type_name::<PlannerServer<()>>(),
        std::any::type_name::<CheckpointStoreServer<()>>(),
    ];
    assert!(
        type_names
            .iter()
            .all(|name| name.starts_with("trellis_proto::v1::"))
    );
}
