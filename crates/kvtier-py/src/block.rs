//! A loaded block: a read-only Python buffer over the bytes kvtier holds, with no copy.
//! The block keeps those bytes alive (a reference to kvtier's buffer), so a view of it
//! stays valid after the engine evicts the block or is closed.
#![expect(
    unsafe_code,
    reason = "the CPython buffer protocol: filling a Py_buffer in __getbuffer__"
)]

use std::ffi::{c_int, c_void};

use bytes::Bytes;
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

/// The struct-module format of one unsigned byte.
const FORMAT: &std::ffi::CStr = c"B";

/// A block's payload (or a snapshot's state): `memoryview(block)` reads it in place.
#[pyclass(frozen, module = "kvtier._kvtier")]
pub struct Block {
    bytes: Bytes,
}

impl Block {
    pub(crate) fn new(bytes: Bytes) -> Self {
        Self { bytes }
    }
}

#[pymethods]
impl Block {
    fn __len__(&self) -> usize {
        self.bytes.len()
    }

    /// The address of the first byte: a view of this block starts here (kvtier's own
    /// memory, not a copy).
    #[getter]
    fn address(&self) -> usize {
        self.bytes.as_ptr() as usize
    }

    /// A copy of the bytes, as `bytes`.
    fn tobytes<'py>(&self, py: Python<'py>) -> Bound<'py, pyo3::types::PyBytes> {
        pyo3::types::PyBytes::new(py, &self.bytes)
    }

    fn __repr__(&self) -> String {
        format!("<kvtier.Block of {} bytes>", self.bytes.len())
    }

    /// The buffer protocol: one read-only dimension of unsigned bytes.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("no view to fill"));
        }
        if flags & ffi::PyBUF_WRITABLE == ffi::PyBUF_WRITABLE {
            return Err(PyBufferError::new_err(
                "a kvtier block is read-only: load into a buffer of your own (load_into) to write",
            ));
        }
        let (ptr, len) = {
            let me = slf.get();
            (me.bytes.as_ptr(), me.bytes.len())
        };
        // SAFETY: `view` is a Py_buffer CPython asks us to fill. `obj` takes a strong
        // reference to the block, which keeps `bytes` (immutable) alive and unmoved for
        // as long as the view exists; `shape` and `strides` point into the view itself.
        unsafe {
            (*view).obj = slf.into_any().into_ptr();
            (*view).buf = ptr.cast_mut().cast::<c_void>();
            (*view).len = len as ffi::Py_ssize_t;
            (*view).readonly = 1;
            (*view).itemsize = 1;
            (*view).format = if flags & ffi::PyBUF_FORMAT == ffi::PyBUF_FORMAT {
                FORMAT.as_ptr().cast_mut()
            } else {
                std::ptr::null_mut()
            };
            (*view).ndim = 1;
            (*view).shape = if flags & ffi::PyBUF_ND == ffi::PyBUF_ND {
                &raw mut (*view).len
            } else {
                std::ptr::null_mut()
            };
            (*view).strides = if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES {
                &raw mut (*view).itemsize
            } else {
                std::ptr::null_mut()
            };
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = std::ptr::null_mut();
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        // Nothing to free: the view's reference to the block is dropped by CPython.
    }
}
