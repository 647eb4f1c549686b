//! kvtier for Python: the extension module `kvtier._kvtier`, wrapped by the pure-Python
//! package `kvtier` (`crates/kvtier-py/python/kvtier`).
//!
//! - [`cache::Cache`]: the one class over the caller API (`kvtier_node::Cache`): an
//!   engine in this process, assembled by `kvtier-node` from the same settings, with the
//!   same defaults, as `kvtier serve`, or a client of `kvtier serve`, with the same calls
//!   (the package's `Engine` and `Client` subclass it; `kvtier.open` chooses).
//! - [`layout`]: a registered layout and the answer to a lookup.
//! - [`state`]: state groups of hybrid and recurrent models, checkpoints, and restores
//!   that return every group's part of one boundary or nothing.
//! - [`block::Block`]: a loaded block — a read-only buffer over kvtier's own memory, so
//!   `memoryview(block)` and `numpy.frombuffer(block)` copy nothing.
//! - [`input`]: buffer-protocol objects (bytes, bytearray, numpy arrays, …) read and
//!   written in place, without copying them into Python objects first.
//! - [`errors`]: every kvtier error as a Python exception carrying the server's error kind.
//!
//! Every call that copies bytes, hashes a prompt or touches a tier releases the GIL.

mod block;
mod cache;
mod direct;
mod errors;
mod input;
mod layout;
mod state;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// Copies `src` into `dst` (a writable buffer of the same length) the way kvtier fills a
/// block: streaming (non-temporal) stores for large copies, which write straight to
/// memory without first reading the destination into the CPU cache. The GIL is released.
/// For benchmarks: with `numpy.copyto`, the best copy into memory out of the cache.
#[pyfunction]
fn stream_copy(py: Python<'_>, dst: &Bound<'_, PyAny>, src: &Bound<'_, PyAny>) -> PyResult<usize> {
    let mut to = input::Exported::get(dst, true, "dst")?;
    let from = input::Exported::get(src, false, "src")?;
    let (d, s) = (to.bytes_mut(), from.bytes());
    if d.len() != s.len() {
        return Err(PyValueError::new_err(format!(
            "dst holds {} bytes and src {}: they must be the same length",
            d.len(),
            s.len()
        )));
    }
    py.detach(|| kvtier_core::copy::copy_to_slice(d, s));
    Ok(s.len())
}

/// The extension module.
#[pymodule]
fn _kvtier(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<cache::Cache>()?;
    m.add_class::<layout::Layout>()?;
    m.add_class::<layout::Hit>()?;
    m.add_class::<block::Block>()?;
    m.add_class::<direct::Lease>()?;
    m.add_class::<direct::Reservation>()?;
    m.add_class::<state::Restored>()?;
    m.add_function(wrap_pyfunction!(stream_copy, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // The core's names of its error kinds, the one table (errors.py's classes are held
    // to it by a test).
    m.add(
        "ERROR_KINDS",
        kvtier_core::ErrorKind::names().collect::<Vec<_>>(),
    )?;
    Ok(())
}
