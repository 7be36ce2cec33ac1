//! The handlers: what each method the gateway serves leads to, whatever the transport
//! (`dispatch`), the methods proxied to the upstreams that run them (`proxy`), and the
//! context every request is served with (`request`). The client's `tasks/*` and a call's task taken in (`tasks`); the task
//! machinery they drive is `crate::tasks`.

pub mod dispatch;
pub mod proxy;
pub mod request;
pub mod tasks;
