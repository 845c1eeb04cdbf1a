//! Every size at which the host data plane changes how it moves a call, in one table.
//!
//! A call takes the first protocol that applies (docs/design/host.md, "Which path a
//! call takes"):
//!
//! | order | protocol | when (thresholds below) |
//! |---|---|---|
//! | 1 | between the buffers (`mapped`) | every rank on this host maps every other's buffers; all_reduce, reduce, reduce_scatter from `mapped_min` (2 ranks: reduce and all_reduce out of place from `mapped_min_2`), broadcast with the root in place from `mapped_broadcast_min` |
//! | 2 | the bulletin board (`fast`, `transport::board`) | every rank on this host; a contribution of at most `board::DATA_MAX` bytes (all_gather, gather, broadcast below `by_links_min`) |
//! | 3 | eager send/recv (`eager`) | a group of only fcclSend/fcclRecv, each below `direct_min` |
//! | 4 | a schedule on the links (`algo`, `engine`) | everything else |
//!
//! Inside a schedule: a message of `direct_min` bytes and more goes by address where
//! the peer can read it (single copy), and from `split_min` its receiver offers the
//! sender a share of the copy; an fcclSend up to `eager_max` sends its payload with
//! its count; all_to_all blocks from `swap_min` and 2-rank all_reduce from `fuse_min`
//! offer an exchange between the two buffers.
//!
//! Each value can be changed for a run with `FERROCCL_HOST_PLAN` (`src/env.rs`), as
//! `name=bytes` pairs separated by commas (`direct_min=64K,split_min=1M`). They decide
//! which messages go where, so every rank must see the same values: set the variable
//! for the whole job. A value that breaks an invariant of the protocols (noted per
//! entry) is refused with a warning and the default kept. Why each default is what
//! it is: docs/results/2026-11-24-host-performance.md.

use crate::transport::board::DATA_MAX;
use std::sync::OnceLock;

macro_rules! plan {
    ($($(#[doc = $doc:literal])* $name:ident: $default:expr,)*) => {
        /// The host data plane's thresholds, in bytes (see the module's table).
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub struct Plan {
            $($(#[doc = $doc])* pub $name: usize,)*
        }

        impl Plan {
            /// The values used unless `FERROCCL_HOST_PLAN` changes them.
            pub const DEFAULT: Plan = Plan { $($name: $default,)* };

            /// Every entry's name, in table order.
            pub const NAMES: &'static [&'static str] = &[$(stringify!($name)),*];

            fn values(&self) -> Vec<usize> {
                vec![$(self.$name),*]
            }

            fn entry(&mut self, name: &str) -> Option<&mut usize> {
                match name {
                    $(stringify!($name) => Some(&mut self.$name),)*
                    _ => None,
                }
            }
        }
    };
}

plan! {
    // The bulletin board (fast, transport::board).
    /// Board contributions of at least this many bytes are written into the slot
    /// with the stores `mem::copy::StoreChoice` picks; smaller ones with ordinary
    /// stores (a clock read would cost more than the copy).
    board_stores_min: 16 << 10,
    /// all_gather, gather and broadcast contributions of at least this many bytes
    /// leave the board for the links, where they can go by address; from
    /// `direct_min` up to here a broadcast's root may hand the call to the links
    /// itself (its flag in the slot says so). The size alone decides, so every rank
    /// does the same without a word.
    by_links_min: 64 << 10,

    // Collectives between the ranks' buffers (mapped).
    /// Calls of 3 ranks or more that reduce a vector of at least this many bytes (all
    /// of it, every rank's blocks together for reduce_scatter): all the board does
    /// not take.
    mapped_min: DATA_MAX + 1,
    /// 2-rank reduce, and 2-rank all_reduce with both ranks out of place, from here
    /// (in place, 2-rank all_reduce keeps its exchange; reduce_scatter its rounds).
    mapped_min_2: 512 << 10,
    /// Broadcasts of 3 ranks or more with the root in place, from here.
    mapped_broadcast_min: 256 << 10,
    /// The vector is taken in pieces of this many bytes (more for vectors of more
    /// than 2^16 pieces a block). A multiple of 64.
    mapped_piece: 128 << 10,
    /// A piece is reduced this many bytes at a time in a buffer that stays in
    /// cache, with every rank's input of it. A multiple of 64.
    mapped_chunk: 16 << 10,

    // Schedules (algo).
    /// Elements of a reduction are pipelined in segments of at most this many bytes.
    seg_bytes: 256 << 10,
    /// In-place all_to_all exchanges each block through the rings in pieces of this
    /// size: a piece and its header fit any ring, so both ranks of a pair can always
    /// write the piece the other waits for. At most 128 KiB.
    inplace_piece: 64 << 10,
    /// all_to_all blocks of at least this many bytes exchange offers first, and are
    /// swapped between the two buffers where both ranks are in place and map each
    /// other's (`engine::Exchange::Swap`). At most `inplace_piece`: a smaller block
    /// is one piece, which pairs up with a whole block of a rank out of place.
    swap_min: 64 << 10,
    /// 2-rank all_reduce of at least this many bytes offers to reduce between both
    /// ranks' buffers (`engine::Exchange::Reduce`).
    fuse_min: 256 << 10,
    /// Largest 2-rank all_reduce that reduces between the buffers with a rank out of
    /// place (there only with streaming stores).
    fuse_out_max: 16 << 20,
    /// Wire bytes of one window of an all_reduce over a narrower wire type: its
    /// scratch is bounded by this whatever the count. The device path cuts windows
    /// alike.
    wire_window: 8 << 20,

    // The engine's messages (engine).
    /// Messages at least this large go by address when the link allows it: below
    /// it, announcing the message and waiting for its read costs more than the copy
    /// saved. At most `eager_max` (the eager path sends everything below it eagerly).
    direct_min: 32 << 10,
    /// Largest fcclSend whose payload goes with its count when it cannot go by
    /// address. Well below the smallest ring (at most 128 KiB), so an eager message
    /// never needs its receiver to free space before it is complete.
    eager_max: 64 << 10,
    /// A direct message is read in pieces of this size, so other peers progress
    /// meanwhile and reductions read a piece still in cache. At least `split_piece`.
    direct_piece: 256 << 10,
    /// Direct messages at least this large into a buffer their sender can write are
    /// copied by sender and receiver together (a split copy).
    split_min: 256 << 10,
    /// Piece of a split copy: the sender takes one at a time, the receiver up to
    /// `direct_piece` at once. A multiple of 64.
    split_piece: 64 << 10,
    /// Smallest in-place fcclSend (its buffer also receives in the run) that goes
    /// by address, and only where ranks share cores.
    gated_min: 4 << 20,
    /// Bytes a gated receive of a direct message reads ahead of what it may write
    /// into a buffer of its own. A multiple of 8.
    gated_ahead: 1 << 20,
    /// Messages of at least this many bytes, in runs that send less than
    /// `ring_stream_max` to the peer in all, are written into the ring with
    /// streaming stores.
    ring_stream_min: 32 << 10,
    /// From this many bytes sent to a peer in one run, ring pieces take the stores
    /// `mem::copy::StoreChoice` picks.
    ring_stream_max: 512 << 10,
    /// A sender rewinds its ring once it has written this far into it and the peer
    /// has read everything, so that messages cycle through the ring's first pages.
    rewind_min: 64 << 10,
    /// Most payload bytes one visit writes into a ring, reads out of one, or copies
    /// locally before the engine turns to the next peer or step. At least 16.
    piece: 64 << 10,
}

impl Plan {
    /// Why `self` cannot be used, or None.
    fn broken(&self) -> Option<&'static str> {
        let m64 = |v: usize| v > 0 && v % 64 == 0;
        if self.values().contains(&0) {
            Some("every value must be at least 1")
        } else if self.eager_max > 128 << 10 {
            Some("eager_max must stay at most 128K (an eager message must fit any ring)")
        } else if self.inplace_piece > 128 << 10 {
            Some("inplace_piece must stay at most 128K (a piece must fit any ring)")
        } else if self.swap_min > self.inplace_piece {
            Some("swap_min must not exceed inplace_piece")
        } else if self.direct_min > self.eager_max {
            Some("direct_min must not exceed eager_max")
        } else if !m64(self.mapped_piece) || !m64(self.mapped_chunk) || !m64(self.split_piece) {
            Some("mapped_piece, mapped_chunk and split_piece must be multiples of 64")
        } else if self.direct_piece < self.split_piece {
            Some("direct_piece must be at least split_piece")
        } else if self.gated_ahead % 8 != 0 {
            Some("gated_ahead must be a multiple of 8")
        } else if self.ring_stream_min > self.ring_stream_max {
            Some("ring_stream_min must not exceed ring_stream_max")
        } else if self.piece < 16 {
            Some("piece must be at least 16")
        } else {
            None
        }
    }

    /// The plan `spec` (the value of `FERROCCL_HOST_PLAN`) asks for, or why not.
    pub fn parse(spec: &str) -> Result<Plan, String> {
        let mut plan = Plan::DEFAULT;
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (name, value) = item.split_once('=').ok_or_else(|| format!("{item:?} is not name=bytes"))?;
            let (name, value) = (name.trim(), value.trim());
            let v = crate::env::parse_bytes(value).ok_or_else(|| format!("{name}={value:?} is not a byte count"))?;
            let slot = plan.entry(name).ok_or_else(|| {
                format!("{name:?} is no threshold of the host plan (known: {})", Plan::NAMES.join(", "))
            })?;
            *slot = v;
        }
        match plan.broken() {
            Some(why) => Err(format!("{spec:?}: {why}")),
            None => Ok(plan),
        }
    }
}

/// The plan of this process: the defaults, with what `FERROCCL_HOST_PLAN` changes
/// (read once).
#[inline]
pub fn get() -> &'static Plan {
    static PLAN: OnceLock<Plan> = OnceLock::new();
    PLAN.get_or_init(|| {
        let Some(spec) = crate::env::HOST_PLAN.get() else { return Plan::DEFAULT };
        match Plan::parse(&spec) {
            Ok(p) => {
                crate::log::info(format_args!("{}={spec:?}: host thresholds {p:?}", crate::env::HOST_PLAN.name));
                p
            }
            Err(why) => {
                crate::log::warn(format_args!("{} ignored, the defaults stay: {why}", crate::env::HOST_PLAN.name));
                Plan::DEFAULT
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_hold_every_invariant() {
        assert_eq!(Plan::DEFAULT.broken(), None);
        assert_eq!(Plan::parse("").unwrap(), Plan::DEFAULT);
    }

    #[test]
    fn values_change_by_name_and_bad_ones_are_refused() {
        let p = Plan::parse(" direct_min = 16K , split_min=1M,piece=4096").unwrap();
        assert_eq!((p.direct_min, p.split_min, p.piece), (16 << 10, 1 << 20, 4096));
        assert_eq!(p.eager_max, Plan::DEFAULT.eager_max, "the rest keep their defaults");
        for (spec, says) in [
            ("direct_mim=1K", "no threshold"),
            ("direct_min", "not name=bytes"),
            ("direct_min=lots", "not a byte count"),
            ("direct_min=0", "at least 1"),
            ("eager_max=1M", "eager_max"),
            ("swap_min=128K", "swap_min"),
            ("direct_min=128K", "direct_min must not exceed"),
            ("split_piece=1000", "multiples of 64"),
            ("ring_stream_min=1M", "ring_stream_min"),
        ] {
            let e = Plan::parse(spec).unwrap_err();
            assert!(e.contains(says), "{spec}: {e}");
        }
    }
}
