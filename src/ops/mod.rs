//! Composite calls built from collectives: coalesced all_reduce and broadcast (buckets
//! of many buffers), reduce_scatter along a tensor axis (packed first), PreMulSum's
//! product before its sum, and the copies between buffers of one process
//! (fcclLocal*). They sit above `comm`: each is a few collectives of a communicator
//! plus the copies around them.

pub mod axis;
pub mod coalesced;
pub mod local;
pub mod premul;
