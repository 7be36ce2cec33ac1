//! The handlers: what each method the gateway serves leads to, whatever the transport
//! (`dispatch`), the methods proxied to the upstreams that run them (`proxy`), and the
//! context every request is served with (`request`). Task methods are in `mcp::tasks`.

pub mod dispatch;
pub mod proxy;
pub mod request;
