//! The key-value service: a RESP2 parser/encoder ([`resp`]), the command
//! engine over one keyspace partition ([`engine`], with the aggregate
//! types in [`types`], sorted sets in [`zset`] and the commands over
//! several whole keys in [`multikey`]), and the service as an
//! actor graph ([`server`]: an acceptor, connection workers, keyspace
//! shards), with optional append-only persistence ([`aof`]).

pub mod aof;
pub mod engine;
pub mod list;
pub mod multikey;
pub mod pubsub;
pub mod resp;
pub mod server;
pub mod types;
pub mod zset;
