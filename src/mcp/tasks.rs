//! The old path of the tasks wire and handlers (`crate::tasks`), kept for the callers that
//! name it (dispatch, proxy, the stateless endpoint) until they are moved.

pub use crate::tasks::serve::handle;
pub use crate::tasks::wire::{
    capability, declares_tasks, listed, upstream_runs_tasks, EXTENSION, METHODS,
};
