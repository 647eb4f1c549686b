//! Buffer-protocol objects read (stores) and written (loads into caller memory) in place.
//!
//! An [`Exported`] holds the exporter's buffer for as long as it lives — the exporter may
//! not move or free the memory meanwhile — so its bytes can be read or written with the
//! GIL released. It must be dropped with the GIL held (every one here is: they are
//! created and dropped in a method that holds the GIL, and only their byte slices cross
//! into code that runs without it).
#![expect(
    unsafe_code,
    reason = "the CPython buffer protocol: PyObject_GetBuffer / PyBuffer_Release on a Py_buffer"
)]

use std::ffi::CStr;

use pyo3::ffi;
use pyo3::prelude::*;

use crate::errors;

/// A buffer exported by a Python object; released when dropped.
pub(crate) struct Exported {
    /// Boxed: CPython may keep pointers into it (`shape`, `strides`) for its lifetime.
    view: Box<ffi::Py_buffer>,
}

impl Exported {
    /// Exports `obj`'s buffer, C-contiguous (and writable with `writable`); `what` names
    /// the argument in the error.
    pub(crate) fn get(obj: &Bound<'_, PyAny>, writable: bool, what: &str) -> PyResult<Self> {
        let mut flags = ffi::PyBUF_C_CONTIGUOUS | ffi::PyBUF_FORMAT;
        if writable {
            flags |= ffi::PyBUF_WRITABLE;
        }
        let mut view: Box<ffi::Py_buffer> = Box::new(ffi::Py_buffer::new());
        // SAFETY: `obj` is a live object (we hold the GIL through `obj`), `view` is a
        // zeroed Py_buffer we own; on failure CPython sets an exception and fills nothing.
        let rc = unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, flags) };
        if rc != 0 {
            let cause = PyErr::fetch(obj.py());
            let need = if writable {
                "a writable, C-contiguous buffer"
            } else {
                "a C-contiguous buffer"
            };
            let kind = obj
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_else(|_| "?".into());
            return Err(errors::invalid(format!(
                "{what} must be {need} (bytes, bytearray, a contiguous numpy array, …); got {kind}: {cause}"
            )));
        }
        Ok(Self { view })
    }

    /// The exported bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        let len = usize::try_from(self.view.len).unwrap_or(0);
        if len == 0 || self.view.buf.is_null() {
            return &[];
        }
        // SAFETY: the exporter guarantees `len` readable bytes at `buf` while the export
        // is held, and it is held as long as `self`.
        unsafe { std::slice::from_raw_parts(self.view.buf.cast::<u8>(), len) }
    }

    /// The exported bytes, writable (only for an export made with `writable`).
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        let len = usize::try_from(self.view.len).unwrap_or(0);
        if len == 0 || self.view.buf.is_null() || self.view.readonly != 0 {
            return &mut [];
        }
        // SAFETY: as in `bytes`, and the export was asked for PyBUF_WRITABLE (so it is
        // not read-only); `&mut self` makes this the only slice handed out.
        unsafe { std::slice::from_raw_parts_mut(self.view.buf.cast::<u8>(), len) }
    }

    /// The size of one item and its struct-module format (`None`: plain bytes).
    pub(crate) fn item(&self) -> (usize, Option<String>) {
        let size = usize::try_from(self.view.itemsize).unwrap_or(1);
        let format = (!self.view.format.is_null()).then(|| {
            // SAFETY: a non-null format is a NUL-terminated string owned by the export.
            unsafe { CStr::from_ptr(self.view.format) }
                .to_string_lossy()
                .into_owned()
        });
        (size, format)
    }
}

impl Drop for Exported {
    fn drop(&mut self) {
        // SAFETY: the view was filled by a successful PyObject_GetBuffer and is released
        // once; the GIL is held (see the module docs).
        unsafe { ffi::PyBuffer_Release(&mut *self.view) };
    }
}

/// Refuses items whose size cannot belong to a layout with `element` bytes per value
/// (a float32 array for an f16 layout, say): plain bytes (`B`, `b`, `c`, no format) are
/// always accepted.
pub(crate) fn check_item(e: &Exported, element: usize, dtype: &str, what: &str) -> PyResult<()> {
    let (size, format) = e.item();
    let raw = matches!(
        format.as_deref(),
        None | Some("B" | "b" | "c" | "<B" | "=B")
    );
    if raw || size == element {
        return Ok(());
    }
    Err(errors::invalid(format!(
        "{what} holds items of {size} bytes (format {}) but the layout's dtype {dtype} has {element}-byte values",
        format.unwrap_or_default()
    )))
}
