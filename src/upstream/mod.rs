//! Upstream connection layer: the public vocabulary (options, events, errors) for talking to one upstream MCP server.
//!
//! One [`Connection`] is one live session with one upstream MCP server, over one of the
//! closed set of [`Transport`]s (a stdio child process, or Streamable HTTP). The connection
//! owns the JSON-RPC plumbing for that session:
//!
//! - **Request ids** come from one [`IdCounter`] per upstream *slot*. The pool creates one
//!   counter per slot and passes a clone into every (re)spawn, so ids are never reused across
//!   epochs of the same slot (an `Arc<AtomicU64>` underneath; ids start at 1 by default).
//! - **Epochs**: every connection carries the epoch the pool gave it; every event and
//!   [`Response`] is tagged with it.
//! - **Pending map**: upstream id → waiter. Unknown response ids (late, cancelled, or from
//!   another epoch) are dropped with a `tracing::warn!`. When the connection dies, every pending
//!   request fails at once with [`UpstreamError::Closed`] and one [`UpstreamEvent::Closed`] is
//!   emitted.
//! - **Cancellation and timeouts**: `notifications/cancelled {requestId}` is sent upstream and the
//!   waiter returns [`UpstreamError::Cancelled`] / [`UpstreamError::Timeout`].
//! - **Progress tokens** are rewritten to connection-unique tokens and mapped back, with the
//!   caller's original token restored in what is delivered.
//! - **Server → client requests**: `ping` is answered here; everything else is emitted as
//!   [`UpstreamEvent::Request`] and answered by the gateway via [`Connection::respond`].
//!
//! What this layer does *not* do: pooling, leases, registrations, id mapping to downstream
//! sessions. Those are built on top of this API.

mod catalog;
mod clients;
mod connection;
mod core;
mod events;
mod forward;
mod http;
mod lease;
pub mod oauth;
mod own_slot;
pub mod pool;
mod reaper;
mod routing;
mod slot;
mod stdio;
mod subscriptions;
mod tokens;
mod types;

pub use connection::Connection;
pub(crate) use core::progress_token;
pub use events::{
    channel as event_channel, EventReceiver, EVENT_BURST, EVENT_QUEUE, EVENT_RATE_PER_S,
};
pub use forward::{CallIds, ForwardCall, ForwardOutcome, Forwarded, On, Request, TaskOwner};
pub use pool::{ConnectionInfo, Pool, UpstreamInfo};
pub use routing::STATELESS_SESSION;
pub use stdio::kill_all_groups;
pub use tokens::Tokens;
pub use types::{
    Answer, Answered, ConnectOptions, Downstream, ForwardError, IdCounter, LogFilter,
    NotificationsRefused, RawResult, RequestOptions, RequestTag, Response, Transport,
    UpstreamError, UpstreamEvent, LEASE_CAPABILITY, MODERN_PROTOCOL_VERSION,
    SUPPORTED_PROTOCOL_VERSIONS, TASKS_EXTENSION,
};
