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
use pyo3::types::{PyList, PyTuple};

use crate::errors;
use kvtier_client::wire::StoreAnswer;
use kvtier_node::CacheLayout;

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
fn check_item(e: &Exported, element: usize, dtype: &str, what: &str) -> PyResult<()> {
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

/// Whether `obj` is a list or tuple (of per-block buffers).
fn is_sequence(obj: &Bound<'_, PyAny>) -> bool {
    obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>()
}

/// The buffers of a store's `blocks`: each item of a list or tuple, or the object itself.
pub(crate) fn exports_of(blocks: &Bound<'_, PyAny>) -> PyResult<Vec<Exported>> {
    if is_sequence(blocks) {
        let mut out = Vec::new();
        for (i, item) in blocks.try_iter()?.enumerate() {
            out.push(Exported::get(&item?, false, &format!("block {i}"))?);
        }
        if out.is_empty() {
            return Err(errors::invalid("no blocks given"));
        }
        Ok(out)
    } else {
        Ok(vec![Exported::get(blocks, false, "blocks")?])
    }
}

/// The payloads of a store of `tokens` tokens under `layout`: one slice per block of the
/// exported buffers (one buffer of whole blocks back to back, or one buffer a block),
/// each checked for its size and item type.
pub(crate) fn payloads_of<'a>(
    layout: &CacheLayout,
    exports: &'a [Exported],
    blocks: &Bound<'_, PyAny>,
    tokens: usize,
) -> PyResult<Vec<&'a [u8]>> {
    let block = layout.block_bytes() as usize;
    let dtype = layout.key().dtype;
    let element = dtype.size_bytes() as usize;
    let dtype = dtype.name();
    for (i, e) in exports.iter().enumerate() {
        check_item(e, element, dtype, &format!("block buffer {i}"))?;
    }
    let mut payloads: Vec<&[u8]> = Vec::new();
    if let [one] = exports
        && !is_sequence(blocks)
    {
        let bytes = one.bytes();
        if bytes.is_empty() || bytes.len() % block != 0 {
            return Err(errors::invalid(format!(
                "the buffer holds {} bytes: not a whole number of {block}-byte blocks",
                bytes.len()
            )));
        }
        payloads.extend(bytes.chunks_exact(block));
    } else {
        for (i, e) in exports.iter().enumerate() {
            if e.bytes().len() != block {
                return Err(errors::invalid(format!(
                    "block {i} has {} bytes; a block of this layout has {block}",
                    e.bytes().len()
                )));
            }
            payloads.push(e.bytes());
        }
    }
    let whole = tokens / layout.tokens_per_block().max(1);
    if payloads.len() > whole {
        return Err(errors::invalid(format!(
            "{} blocks given for {tokens} tokens: at most {whole} whole blocks",
            payloads.len()
        )));
    }
    Ok(payloads)
}

/// A store's answer as the dict both the engine and the client return.
pub(crate) fn store_report<'py>(
    py: Python<'py>,
    answer: &StoreAnswer,
) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
    let out = pyo3::types::PyDict::new(py);
    out.set_item("stored", answer.stored)?;
    out.set_item("duplicates", answer.duplicates)?;
    out.set_item("stored_lower_only", answer.stored_lower_only)?;
    out.set_item("stopped", answer.stopped.as_deref())?;
    out.set_item("ack", &answer.durability)?;
    Ok(out)
}
