//! The key-value service's protocol and engine (issue 5, in progress): a
//! RESP2 parser/encoder ([`resp`]) and the command engine over one keyspace
//! ([`engine`]). The network side (acceptor handing sockets to workers,
//! keyspace shards as actors) builds on these.

pub mod engine;
pub mod resp;
