//! MCP tasks, a peer of the call: the [`table`] of live tasks (the gateway's ids, each
//! task's state and settle latch), the two [`wire`] forms as pure translation, each live
//! task's [`driver`] (poll, result, inputs, cancel, probe after reconnect, TTL), the one
//! [`settle`] path. One layer, beside the hub (`tests/modgraph.py`); a call's task taken in and
//! a client's `tasks/*` answered are handlers, in `crate::methods::tasks`.

pub mod driver;
pub mod settle;
pub mod table;
pub mod wire;

pub use table::{
    mint_id, upstream_digest, Final, NewTask, ProgressTo, Refused, Status, Task, TaskOutcome,
    TaskProgress, TaskSpec, TaskTable, MAX_INPUTS, RELATED_TASK,
};
