//! The layout of the reduction kernels' parameters (`Reduction::source`): the tables
//! that travel by value in a launch's arguments, sized to CUDA's classic limit.

/// Most inputs of one row and most outputs of one launch: the pointers travel by value
/// in the kernel's arguments (8 bytes each; kernel parameters may take [`PARAM_LIMIT`]).
pub const MAX_INPUTS: usize = 64;

/// Most block rows of one launch: the size of its per-row count table.
pub const MAX_ROWS: usize = 64;

/// The bytes of parameters a kernel may take: CUDA's classic limit, which every driver
/// and architecture accepts (32764 needs CUDA 12.1 and Volta or later).
pub const PARAM_LIMIT: usize = 4096;

/// The reduction kernels' parameters besides the input table (see `Reduction::source`):
/// the output and count tables, `n`, `nout`, `ip` (and 4 bytes of padding before the next
/// 8-byte one), `step`, `win` (wire kernels) and `failed`.
const FIXED_PARAM_BYTES: usize = 8 * MAX_INPUTS + 8 * MAX_ROWS + 16 + 3 * 8;

/// Input pointers one launch takes: all that fit in [`PARAM_LIMIT`] with the rest of the
/// parameters. Rows of their own inputs (`ip` = n) take `n` each, so one launch holds
/// `IN_TABLE / n` of them (every row of a reduce_scatter_v up to 19 ranks).
pub const IN_TABLE: usize = (PARAM_LIMIT - FIXED_PARAM_BYTES) / 8;

/// Rows of their own `n` inputs each (`ip` = n) that one launch's input table holds.
#[inline]
pub fn own_rows(n: usize) -> usize {
    IN_TABLE / n.max(1)
}

/// The bytes of a reduction kernel's parameters as the compiler lays them out (each at
/// its natural alignment); within [`PARAM_LIMIT`].
pub const fn reduce_param_bytes(wire: bool) -> usize {
    let tables = 8 * (MAX_INPUTS + IN_TABLE + MAX_ROWS);
    // n, nout, ip, then step ([win], failed) at the next multiple of 8.
    tables + 16 + 8 * if wire { 3 } else { 2 }
}

const _: () = assert!(reduce_param_bytes(true) <= PARAM_LIMIT && IN_TABLE >= MAX_INPUTS && MAX_ROWS >= MAX_INPUTS);

/// The parameters every reduction kernel starts with (see `Reduction::source`).
pub(super) fn head_params(name: &str) -> String {
    format!(
        "struct {name}_outs outs, struct {name}_ins ins, struct {name}_counts counts, int n, int nout, int ip,\n    \
         unsigned long long step"
    )
}

/// The input and output pointer tables and the count table of a kernel of element type `T`.
pub(super) fn tables(name: &str) -> String {
    let (m, i, r) = (MAX_INPUTS, IN_TABLE, MAX_ROWS);
    format!(
        "struct {name}_ins {{ const T* p[{i}]; }};\nstruct {name}_outs {{ T* p[{m}]; }};\n\
         struct {name}_counts {{ unsigned long long c[{r}]; }};\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reduction_parameters_fill_the_classic_limit_and_hold_whole_rows() {
        // A wire kernel's parameters take the 4 KiB exactly; a plain one's 8 bytes fewer.
        assert_eq!(reduce_param_bytes(true), PARAM_LIMIT);
        assert_eq!(reduce_param_bytes(false), PARAM_LIMIT - 8);
        // Every row of a reduce_scatter_v of up to 19 ranks in one launch; one row of the
        // most inputs a row takes always fits.
        assert_eq!(IN_TABLE, 379);
        let launches = |n: usize| n.div_ceil(own_rows(n));
        assert_eq!((1..=19).map(launches).max(), Some(1));
        assert_eq!((launches(20), own_rows(20)), (2, 18));
        assert_eq!((launches(62), own_rows(62)), (11, 6));
        assert_eq!(own_rows(MAX_INPUTS), 5);
    }
}
