//! Reads a torch tensor's own description of its memory (DLPack) into a `HostTensor`.
//!
//! Python hands the native module tensor objects, never addresses: the address, dtype, sizes,
//! strides and device come from torch's C code for that very tensor, so the pointer is that
//! tensor's storage. Two readers, same result: DLPack's exchange API (torch >= 2.10 fills a
//! `DLTensor` on the stack, tens of nanoseconds) and `torch._C._to_dlpack` (every supported
//! torch: an owned capsule, freed when it drops). What DLPack does not carry, the lazy
//! negation and conjugation bits, is asked of the tensor: memory read through such a view means
//! something else than its values.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::{ffi, intern};

use crate::core::host_tensor::{HostTensor, MAX_RANK};
use crate::core::tensor::DType;

/// Why an object is not a tensor the native module can take.
pub enum Refusal {
    /// Not a torch tensor at all (a `TypeError`).
    NotTensor(String),
    /// A tensor whose memory cannot be read as it is (a `ValueError`).
    Unreadable(String),
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

/// The capsule `torch._C._to_dlpack` returns ("dltensor", DLPack 0.x and 1.x alike).
#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

/// `DLPackExchangeAPI` of DLPack 1.x: a stable header, then function pointers.
#[repr(C)]
struct ExchangeApi {
    version: DLPackVersion,
    prev_api: *const c_void,
    managed_tensor_allocator: *const c_void,
    managed_tensor_from_py_object_no_sync: *const c_void,
    managed_tensor_to_py_object_no_sync: *const c_void,
    dltensor_from_py_object_no_sync: Option<FillFn>,
    current_work_stream: *const c_void,
}

type FillFn = unsafe extern "C" fn(*mut c_void, *mut DLTensor) -> c_int;

const DL_CPU: i32 = 1;

struct Torch {
    /// `torch._C.TensorBase`: every torch tensor, subclasses included, has its C layout.
    tensor_type: Py<PyAny>,
    /// The exchange API's non-owning reader, when this torch has one.
    fill: Option<FillFn>,
    to_dlpack: Py<PyAny>,
}

static TORCH: PyOnceLock<Torch> = PyOnceLock::new();
/// Set by `_native._dlpack_reader("capsule")`: the tests run the older torch's reader too.
static CAPSULE_ONLY: AtomicBool = AtomicBool::new(false);

fn torch(py: Python<'_>) -> PyResult<&'static Torch> {
    TORCH.get_or_try_init(py, || {
        let c = py.import("torch._C")?;
        let tensor = py.import("torch")?.getattr("Tensor")?;
        Ok(Torch { tensor_type: c.getattr("TensorBase")?.unbind(), fill: exchange_fill(&tensor), to_dlpack: c.getattr("_to_dlpack")?.unbind() })
    })
}

/// The exchange API's `dltensor_from_py_object_no_sync`, when torch publishes a DLPack 1.x one.
fn exchange_fill(tensor: &Bound<'_, PyAny>) -> Option<FillFn> {
    let capsule = tensor.getattr("__dlpack_c_exchange_api__").ok()?;
    // SAFETY: PyCapsule_GetPointer checks the capsule's type and name (NULL and an exception
    // otherwise, cleared below); the API it points to lives as long as the process (DLPack's rule).
    let api = unsafe { ffi::PyCapsule_GetPointer(capsule.as_ptr(), c"dlpack_exchange_api".as_ptr()) } as *const ExchangeApi;
    if api.is_null() {
        drop(PyErr::take(tensor.py()));
        return None;
    }
    // SAFETY: a live DLPackExchangeAPI; its layout is fixed for a major version of 1.
    unsafe { ((*api).version.major == 1).then_some((*api).dltensor_from_py_object_no_sync).flatten() }
}

/// Which reader is in force ("exchange" or "capsule"); `name` switches it (tests only).
pub fn reader(py: Python<'_>, name: Option<&str>) -> PyResult<&'static str> {
    match name {
        None => {}
        Some("capsule") => CAPSULE_ONLY.store(true, Ordering::Relaxed),
        Some("exchange") => CAPSULE_ONLY.store(false, Ordering::Relaxed),
        Some(other) => return Err(pyo3::exceptions::PyValueError::new_err(format!("reader must be 'exchange' or 'capsule', got {other:?}"))),
    }
    let exchange = torch(py)?.fill.is_some() && !CAPSULE_ONLY.load(Ordering::Relaxed);
    Ok(if exchange { "exchange" } else { "capsule" })
}

/// `obj` as a validated `HostTensor`.
pub fn read(obj: &Bound<'_, PyAny>) -> Result<HostTensor, Refusal> {
    let py = obj.py();
    let t = torch(py).map_err(|e| Refusal::Unreadable(first_line(py, &e)))?;
    // SAFETY: both are live type objects; PyObject_TypeCheck walks the MRO (no __instancecheck__).
    if unsafe { ffi::PyObject_TypeCheck(obj.as_ptr(), t.tensor_type.as_ptr().cast()) } == 0 {
        let kind = obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into());
        return Err(Refusal::NotTensor(format!("expected a torch.Tensor, got {kind}")));
    }
    let read = match t.fill.filter(|_| !CAPSULE_ONLY.load(Ordering::Relaxed)) {
        Some(fill) => {
            let mut dl = std::mem::MaybeUninit::<DLTensor>::zeroed();
            // SAFETY: `obj` is a torch tensor (checked above), the API's own type; the DLTensor
            // it fills borrows the tensor's shape and strides, read before `obj` is released.
            if unsafe { fill(obj.as_ptr().cast(), dl.as_mut_ptr()) } != 0 {
                return Err(unreadable(obj, &PyErr::fetch(py)));
            }
            // SAFETY: filled by a successful call.
            unsafe { describe(&dl.assume_init()) }
        }
        None => {
            let capsule = t.to_dlpack.bind(py).call1((obj,)).map_err(|e| unreadable(obj, &e))?;
            // SAFETY: the capsule torch just made; NULL (with an exception) if it is not one.
            let managed = unsafe { ffi::PyCapsule_GetPointer(capsule.as_ptr(), c"dltensor".as_ptr()) } as *const DLManagedTensor;
            if managed.is_null() {
                return Err(Refusal::Unreadable(first_line(py, &PyErr::fetch(py))));
            }
            // SAFETY: the capsule owns the managed tensor until it drops, after this read.
            unsafe { describe(&(*managed).dl_tensor) }
        }
    };
    let host = read.map_err(|why| match why {
        Some(why) => Refusal::Unreadable(why),
        None => Refusal::Unreadable(format!("dtype {} is not one native_cpu takes", attr(obj, "dtype"))),
    })?;
    if flag(obj, intern!(py, "is_neg"))? {
        return Err(Refusal::Unreadable("a lazily negated view (pass t.resolve_neg())".into()));
    }
    if host.dtype.is_complex() && flag(obj, intern!(py, "is_conj"))? {
        return Err(Refusal::Unreadable("a lazily conjugated view (pass t.resolve_conj())".into()));
    }
    Ok(host)
}

/// The `HostTensor` a DLTensor describes; `Err(None)` for a dtype the crate has no name for.
///
/// # Safety
/// `dl` is a DLTensor its producer filled, with `ndim` sizes (and strides unless NULL).
unsafe fn describe(dl: &DLTensor) -> Result<HostTensor, Option<String>> {
    if dl.device.device_type != DL_CPU {
        return Err(Some(format!("a tensor on DLPack device type {} (native_cpu takes CPU tensors)", dl.device.device_type)));
    }
    let dtype = dtype_of(dl.dtype).ok_or(None)?;
    let rank = usize::try_from(dl.ndim).ok().filter(|&r| r <= MAX_RANK).ok_or_else(|| Some(format!("{} dims", dl.ndim)))?;
    let dims = |p: *const i64| if rank == 0 { &[][..] } else { std::slice::from_raw_parts(p, rank) };
    if rank > 0 && dl.shape.is_null() {
        return Err(Some("no sizes".into()));
    }
    let strides = (!dl.strides.is_null()).then(|| dims(dl.strides));
    HostTensor::new(dl.data as usize, dl.byte_offset, dtype, dims(dl.shape), strides).map_err(Some)
}

/// The DLPack (type code, bits) of each dtype the crate has.
const DTYPES: [(u8, u8, DType); 13] = [
    (0, 8, DType::I8), (0, 16, DType::I16), (0, 32, DType::I32), (0, 64, DType::I64), // kDLInt
    (1, 8, DType::U8), (6, 8, DType::Bool), // kDLUInt, kDLBool
    (2, 16, DType::F16), (2, 32, DType::F32), (2, 64, DType::F64), (4, 16, DType::BF16), // kDLFloat, kDLBfloat
    (5, 32, DType::C32), (5, 64, DType::C64), (5, 128, DType::C128), // kDLComplex
];

fn dtype_of(d: DLDataType) -> Option<DType> {
    let found = DTYPES.iter().find(|&&(code, bits, _)| (code, bits) == (d.code, d.bits));
    found.filter(|_| d.lanes == 1).map(|&(_, _, dtype)| dtype)
}

fn flag(obj: &Bound<'_, PyAny>, method: &Bound<'_, pyo3::types::PyString>) -> Result<bool, Refusal> {
    obj.call_method0(method).and_then(|v| v.is_truthy()).map_err(|e| Refusal::Unreadable(first_line(obj.py(), &e)))
}

fn attr(obj: &Bound<'_, PyAny>, name: &str) -> String {
    obj.getattr(name).and_then(|v| v.str().map(|s| s.to_string())).unwrap_or_else(|_| "?".into())
}

/// Why torch could not describe `obj`: its device when that is not the CPU, else torch's word.
fn unreadable(obj: &Bound<'_, PyAny>, e: &PyErr) -> Refusal {
    let device = attr(obj, "device");
    if device != "cpu" && device != "?" {
        return Refusal::Unreadable(format!("a tensor on {device} (native_cpu takes CPU tensors)"));
    }
    Refusal::Unreadable(first_line(obj.py(), e))
}

/// torch's C++ errors carry a backtrace after the first line.
fn first_line(py: Python<'_>, e: &PyErr) -> String {
    let text = e.value(py).str().map(|s| s.to_string()).unwrap_or_default();
    text.lines().next().unwrap_or("").to_string()
}
