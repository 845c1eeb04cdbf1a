//! Links between ranks of one host through shared memory.
//!
//! - [`segment`]: a rank's segment and where everything in it lies (header words,
//!   one ring per peer, the bulletin board);
//! - [`ring`]: one ring, seen from its writer or its reader;
//! - [`link`]: [`ShmLink`], a pair of rings as a `transport::Link`;
//! - [`peer_mem`]: what a rank can do with a peer's memory beyond the rings
//!   (`transport::PeerMemory`): single copy, split copies, swaps, mappings.

pub mod link;
pub mod peer_mem;
mod ring;
pub mod segment;

pub use link::ShmLink;
pub use peer_mem::{allow_peer_reads, Share, ShareDest};
pub use segment::{remove_dead_of, remove_stale_segments, ring_bytes_for, segment_bytes, Segment, SweepOnFailure};
