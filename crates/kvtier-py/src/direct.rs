//! Direct access to block memory from Python (`Cache.lease`, `Cache.reserve`): where
//! blocks lie or are to be written, as addresses, for a caller that moves the bytes itself
//! (`kvtier.torch`: a GPU's copies). See `kvtier_node::BlockLease` and `BlockReservation`.

use kvtier_core::Ack;
use kvtier_node::{BlockLease, BlockReservation};
use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{from_core, invalid};
use crate::input::store_report;

/// The blocks of a hit held in place: `places` is `(address, nbytes)` of each, valid until
/// `release()` (or the end of a `with` block, or garbage collection).
#[pyclass(frozen, module = "kvtier._kvtier")]
pub struct Lease {
    inner: Mutex<Option<BlockLease>>,
    places: Vec<(usize, usize)>,
}

impl Lease {
    pub(crate) fn new(lease: BlockLease) -> Self {
        Self {
            places: lease.places().to_vec(),
            inner: Mutex::new(Some(lease)),
        }
    }
}

#[pymethods]
impl Lease {
    /// `(address, nbytes)` of each leased block, in order (read-only memory).
    #[getter]
    fn places(&self) -> Vec<(usize, usize)> {
        self.places.clone()
    }

    fn __len__(&self) -> usize {
        self.places.len()
    }

    /// Ends the lease: the addresses are no longer valid.
    fn release(&self, py: Python<'_>) {
        let lease = self.inner.lock().take();
        py.detach(move || drop(lease));
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) {
        self.release(py);
    }
}

/// Room for the blocks of a store: write each block whole at its `places` entry
/// `(address, nbytes)`, then `commit()`; `cancel()` gives the room back.
#[pyclass(frozen, module = "kvtier._kvtier")]
pub struct Reservation {
    inner: Mutex<Option<BlockReservation>>,
    places: Vec<(usize, usize)>,
}

impl Reservation {
    pub(crate) fn new(reservation: BlockReservation) -> Self {
        Self {
            places: reservation.places().to_vec(),
            inner: Mutex::new(Some(reservation)),
        }
    }

    fn take(&self) -> PyResult<BlockReservation> {
        self.inner
            .lock()
            .take()
            .ok_or_else(|| invalid("this reservation was committed or cancelled already"))
    }
}

#[pymethods]
impl Reservation {
    /// `(address, nbytes)` where each block is to be written, in order.
    #[getter]
    fn places(&self) -> Vec<(usize, usize)> {
        self.places.clone()
    }

    fn __len__(&self) -> usize {
        self.places.len()
    }

    /// Stores the blocks as written; the same answer as `store`. `durability`:
    /// `queued`, `written` or `synced` (default: the cache's).
    #[pyo3(signature = (durability=None))]
    fn commit<'py>(
        &self,
        py: Python<'py>,
        durability: Option<&str>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let ack: Option<Ack> = durability
            .map(|d| {
                d.parse().map_err(|_| {
                    invalid(format!(
                        "durability `{d}`: expected queued, written or synced"
                    ))
                })
            })
            .transpose()?;
        let reservation = self.take()?;
        let answer = py.detach(|| reservation.commit(ack)).map_err(from_core)?;
        store_report(py, &answer)
    }

    /// Gives the room back without storing.
    fn cancel(&self, py: Python<'_>) -> PyResult<()> {
        let reservation = self.take()?;
        py.detach(|| reservation.cancel()).map_err(from_core)
    }
}
