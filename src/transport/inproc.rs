//! Links between ranks that are threads of one process (`fcclCommInitAll`).
//!
//! The same rings as between processes, in anonymous memory: one code path for the
//! protocol, no shared-memory names, nothing to clean up but the mappings.

use super::shm::{ring_bytes_for, Segment, ShmLink};
use super::{Link, Transport};
use crate::error::Result;
use std::sync::Arc;

/// Builds the transports of all `nranks` thread ranks at once.
pub fn build(nranks: usize) -> Result<Vec<Transport>> {
    build_with_ring(nranks, ring_bytes_for(nranks))
}

/// As [`build`], with rings of `ring` bytes (a multiple of the page size): tests
/// use small ones, where messages wrap around the ring end all the time.
pub fn build_with_ring(nranks: usize, ring: usize) -> Result<Vec<Transport>> {
    let segs: Vec<Arc<Segment>> =
        (0..nranks).map(|_| Segment::anonymous(nranks, ring).map(Arc::new)).collect::<Result<_>>()?;
    Ok((0..nranks)
        .map(|me| {
            let links = (0..nranks)
                .map(|p| {
                    (p != me).then(|| {
                        Box::new(ShmLink::new(me, p, segs[me].clone(), segs[p].clone(), false)) as Box<dyn Link>
                    })
                })
                .collect();
            Transport::new(me, nranks, links, segs.iter().cloned().map(Some).collect())
        })
        .collect())
}
