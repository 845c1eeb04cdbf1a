//! Copies between host and device memory and between device buffers, ordered on a
//! stream or waited for.

use super::*;

/// Copies device (or managed) memory to host memory, ordered on `stream`.
///
/// # Safety
/// `src` is device-accessible for `bytes`, `dst` host memory writable for `bytes`
/// until the stream has passed the copy; a context is current.
pub unsafe fn copy_dtoh_async(dst: *mut u8, src: *const u8, bytes: usize, stream: Stream) -> Result<()> {
    // SAFETY: guaranteed by the caller.
    let rc = unsafe { cu::cuMemcpyDtoHAsync_v2(dst.cast(), src as usize as u64, bytes, stream.raw()) };
    check(rc, "cuMemcpyDtoHAsync")
}

/// Copies host memory to device memory, ordered on `stream`.
///
/// # Safety
/// As [`copy_dtoh_async`], the other way round.
pub unsafe fn copy_htod_async(dst: *mut u8, src: *const u8, bytes: usize, stream: Stream) -> Result<()> {
    // SAFETY: guaranteed by the caller.
    let rc = unsafe { cu::cuMemcpyHtoDAsync_v2(dst as usize as u64, src.cast(), bytes, stream.raw()) };
    check(rc, "cuMemcpyHtoDAsync")
}

/// Copies `bytes` from host to device memory and waits (on the current context, or
/// device 0's primary context if none; ordered after the legacy default stream).
///
/// # Safety
/// `dst` is device memory and `src` host memory, each valid for `bytes`.
pub unsafe fn copy_to_device(dst: *mut u8, src: *const u8, bytes: usize) -> Result<()> {
    let _g = CtxGuard::enter(Ctx::NONE)?;
    // SAFETY: guaranteed by the caller; synchronised before returning.
    unsafe { copy_htod_async(dst, src, bytes, Stream::DEFAULT)? };
    sync(Stream::DEFAULT)
}

/// Copies `bytes` from device to host memory and waits (as [`copy_to_device`]).
///
/// # Safety
/// `src` is device memory and `dst` host memory, each valid for `bytes`.
pub unsafe fn copy_to_host(dst: *mut u8, src: *const u8, bytes: usize) -> Result<()> {
    let _g = CtxGuard::enter(Ctx::NONE)?;
    // SAFETY: guaranteed by the caller; synchronised before returning.
    unsafe { copy_dtoh_async(dst, src, bytes, Stream::DEFAULT)? };
    sync(Stream::DEFAULT)
}

/// Copies `bytes` between any two buffers of this process (host or device: the
/// driver tells them apart by address) in context `ctx`, and returns when done.
///
/// # Safety
/// Both ranges are valid for `bytes` and do not overlap.
pub unsafe fn copy_sync(dst: *mut u8, src: *const u8, bytes: usize, ctx: Ctx) -> Result<()> {
    let _g = CtxGuard::enter(ctx)?;
    // SAFETY: guaranteed by the caller; with unified addressing cuMemcpy infers the
    // direction from the pointers and completes before returning for these copies.
    check(unsafe { cu::cuMemcpy(dst as usize as u64, src as usize as u64, bytes) }, "cuMemcpy")?;
    // Host-to-device copies from pageable memory may return before the DMA ends.
    // SAFETY: the legacy default stream of the context pushed above.
    check(unsafe { cu::cuCtxSynchronize() }, "cuCtxSynchronize")
}

/// Device-to-device copy ordered on `stream`.
///
/// # Safety
/// Both ranges are device memory valid for `bytes` in the current context until the
/// stream has run the copy; [`ipc_ready`] succeeded.
pub unsafe fn copy_dtod_async(dst: *mut u8, src: *const u8, bytes: usize, stream: Stream) -> Result<()> {
    // SAFETY: guaranteed by the caller.
    let rc = unsafe { cu::cuMemcpyDtoDAsync_v2(dst as usize as u64, src as usize as u64, bytes, stream.raw()) };
    check(rc, "cuMemcpyDtoDAsync")
}

/// Copies `rows` rows of `width` bytes between device buffers whose rows start
/// `src_pitch` and `dst_pitch` bytes apart, ordered on `stream`.
///
/// # Safety
/// Every row lies inside device memory of the current context, valid until the
/// stream has run the copy; source and destination do not overlap.
pub unsafe fn copy_2d_dtod_async(
    dst: *mut u8,
    dst_pitch: usize,
    src: *const u8,
    src_pitch: usize,
    width: usize,
    rows: usize,
    stream: Stream,
) -> Result<()> {
    let (d, s) = (
        Side { ptr: dst as usize, pitch: dst_pitch, host: false },
        Side { ptr: src as usize, pitch: src_pitch, host: false },
    );
    // SAFETY: forwarded contract.
    unsafe { copy_2d_async(d, s, width, rows, stream) }
}

/// One side of a 2D copy: where its first row starts, how far apart rows are, and
/// whether it is host memory (page-locked, or the copy is not asynchronous).
#[derive(Clone, Copy, Debug)]
pub struct Side {
    pub ptr: usize,
    pub pitch: usize,
    pub host: bool,
}

/// Copies `rows` rows of `width` bytes from `src` to `dst`, ordered on `stream`:
/// one cuMemcpy2DAsync (row by row where a pitch is too wide for it).
///
/// # Safety
/// Every row of each side lies inside memory of its kind (device memory of the
/// current context, or host memory), valid until the stream has run the copy; the
/// two sides do not overlap.
pub unsafe fn copy_2d_async(dst: Side, src: Side, width: usize, rows: usize, stream: Stream) -> Result<()> {
    if width == 0 || rows == 0 {
        return Ok(());
    }
    // cuMemcpy2D takes pitches below 2^31 (CU_DEVICE_ATTRIBUTE_MAX_PITCH); wider
    // tensors go row by row.
    const MAX_PITCH: usize = i32::MAX as usize;
    if rows == 1 || src.pitch > MAX_PITCH || dst.pitch > MAX_PITCH {
        for r in 0..rows {
            let (d, s) = ((dst.ptr + r * dst.pitch) as *mut u8, (src.ptr + r * src.pitch) as *const u8);
            // SAFETY: row r of each side lies inside its buffer (caller's contract).
            unsafe {
                match (dst.host, src.host) {
                    (false, false) => copy_dtod_async(d, s, width, stream)?,
                    (true, false) => copy_dtoh_async(d, s, width, stream)?,
                    (false, true) => copy_htod_async(d, s, width, stream)?,
                    (true, true) => return Err(Error::internal("a 2D copy between two host buffers")),
                }
            }
        }
        return Ok(());
    }
    let kind =
        |host: bool| if host { cu::CUmemorytype::CU_MEMORYTYPE_HOST } else { cu::CUmemorytype::CU_MEMORYTYPE_DEVICE };
    // Written out whole: the memory-type enum has no zero value, so zeroed() is UB.
    let p = cu::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: kind(src.host),
        srcHost: if src.host { src.ptr as *const std::ffi::c_void } else { std::ptr::null() },
        srcDevice: if src.host { 0 } else { src.ptr as u64 },
        srcArray: std::ptr::null_mut(),
        srcPitch: src.pitch,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: kind(dst.host),
        dstHost: if dst.host { dst.ptr as *mut std::ffi::c_void } else { std::ptr::null_mut() },
        dstDevice: if dst.host { 0 } else { dst.ptr as u64 },
        dstArray: std::ptr::null_mut(),
        dstPitch: dst.pitch,
        WidthInBytes: width,
        Height: rows,
    };
    // SAFETY: guaranteed by the caller; p describes the rows above.
    check(unsafe { cu::cuMemcpy2DAsync_v2(&p, stream.raw()) }, "cuMemcpy2DAsync")
}
