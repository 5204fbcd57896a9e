//! numpy at the boundary: checking user arrays against a signature and exposing
//! their bytes, and allocating output arrays. The raw buffer access of the
//! bindings is confined to this module.

use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyString};
use reprise_core::signature::{describe, Signature};

use crate::errors::{invalid, not_found};

/// One field of a signature, with the Python objects the hot path needs.
pub struct FieldInfo {
    pub name: String,
    pub py_name: Py<PyString>,
    pub dtype: Py<PyArrayDescr>,
    pub dtype_name: &'static str,
    pub shape: Vec<usize>,
    pub row_bytes: usize,
    pub describe: String,
}

pub fn field_infos(py: Python<'_>, sig: &Signature) -> PyResult<Vec<FieldInfo>> {
    sig.fields()
        .iter()
        .map(|f| {
            Ok(FieldInfo {
                name: f.name.clone(),
                py_name: PyString::new(py, &f.name).unbind(),
                dtype: PyArrayDescr::new(py, f.dtype.name())?.unbind(),
                dtype_name: f.dtype.name(),
                shape: f.shape.clone(),
                row_bytes: f.row_bytes(),
                describe: f.describe(),
            })
        })
        .collect()
}

static CONVERT: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// The pure-Python helpers in `reprise._convert`.
pub fn convert_module(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    CONVERT.get_or_try_init(py, || Ok(py.import("reprise._convert")?.unbind())).map(|m| m.bind(py))
}

/// A C-contiguous array whose bytes can be read; keeps the array alive.
pub struct View<'py> {
    array: Bound<'py, PyUntypedArray>,
    len: usize,
}

impl View<'_> {
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `array` is C-contiguous (checked in `view`) and alive as long as
        // `self`; its buffer holds `len` bytes (product of its shape x itemsize).
        unsafe {
            let data = (*self.array.as_array_ptr()).data as *const u8;
            if self.len == 0 {
                &[]
            } else {
                std::slice::from_raw_parts(data, self.len)
            }
        }
    }

    /// The leading dimensions (those before the field's shape).
    pub fn leading(&self, n: usize) -> &[usize] {
        &self.array.shape()[..n]
    }
}

/// Checks `value` as data for field `f` with `lead` leading dimensions (0 for one
/// step, 1 for `[T, ...]`, 2 for `[n, T, ...]`) and exposes its bytes.
///
/// numpy arrays must have exactly the field's dtype; Python scalars and lists are
/// converted when no value changes (see `reprise._convert`).
pub fn view<'py>(py: Python<'py>, value: &Bound<'py, PyAny>, f: &FieldInfo, lead: usize, what: &str) -> PyResult<View<'py>> {
    let array: Bound<'py, PyUntypedArray> = match value.cast::<PyUntypedArray>() {
        Ok(a) => a.clone(),
        Err(_) => convert_module(py)?
            .getattr("to_field_array")?
            .call1((value, f.dtype_name, &f.name, &f.describe))?
            .cast_into::<PyUntypedArray>()
            .map_err(|_| invalid(py, format!("field '{}': could not convert the value to an array", f.name)))?,
    };
    let shape = array.shape();
    let dtype = array.dtype();
    let shape_ok = shape.len() == lead + f.shape.len() && shape[lead..] == f.shape[..];
    if !dtype.is_equiv_to(f.dtype.bind(py)) || !shape_ok {
        let got_dtype: String = dtype.str().map(|s| s.to_string()).unwrap_or_default();
        let got_dtype = dtype_display(&got_dtype);
        let expected = match lead {
            0 => f.describe.clone(),
            1 => format!("{}[T,{}]", f.dtype_name, dims(&f.shape)),
            _ => format!("{}[n,T,{}]", f.dtype_name, dims(&f.shape)),
        };
        return Err(invalid(
            py,
            format!("{what}field '{}' expects {}, got {}", f.name, expected.replace(",]", "]"), describe(&got_dtype, shape)),
        ));
    }
    let array = if array.is_c_contiguous() {
        array
    } else {
        py.import("numpy")?.getattr("ascontiguousarray")?.call1((array,))?.cast_into::<PyUntypedArray>()?
    };
    let len = array.shape().iter().product::<usize>() * f.row_bytes / f.shape.iter().product::<usize>().max(1);
    Ok(View { array, len })
}

fn dims(shape: &[usize]) -> String {
    shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(",")
}

/// numpy's `str(dtype)` is `<f4` style for non-native or `float32` style names.
fn dtype_display(s: &str) -> String {
    s.trim_start_matches('|').to_string()
}

/// Looks up every field of a step (or batch) mapping, in signature order.
/// Unknown names are `NotFound`; missing ones `InvalidArgument`.
pub fn views<'py>(py: Python<'py>, data: &Bound<'py, PyAny>, fields: &[FieldInfo], lead: usize, what: &str) -> PyResult<Vec<View<'py>>> {
    let dict = match data.cast::<PyDict>() {
        Ok(d) => d.clone(),
        Err(_) => PyDict::from_sequence(&data.call_method0("items").map_err(|_| {
            invalid(py, format!("{what}expected a dict of field name -> array, got {}", type_name(data)))
        })?)?,
    };
    let mut out = Vec::with_capacity(fields.len());
    for f in fields {
        match dict.get_item(f.py_name.bind(py))? {
            Some(v) => out.push(view(py, &v, f, lead, what)?),
            None => {
                return Err(invalid(py, format!("{what}missing field '{}' ({}); expected fields {}", f.name, f.describe, names(fields))));
            }
        }
    }
    if dict.len() > fields.len() {
        for (k, _) in dict.iter() {
            let known = k.cast::<PyString>().ok().and_then(|s| s.to_str().ok().map(|s| fields.iter().any(|f| f.name == s))).unwrap_or(false);
            if !known {
                return Err(not_found(py, format!("{what}unknown field {}; expected fields {}", k.repr()?, names(fields))));
            }
        }
    }
    Ok(out)
}

fn names(fields: &[FieldInfo]) -> String {
    fields.iter().map(|f| format!("'{}'", f.name)).collect::<Vec<_>>().join(", ")
}

pub fn type_name(v: &Bound<'_, PyAny>) -> String {
    v.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
}

/// A new C-contiguous array and its writable bytes.
pub fn new_array<'py>(py: Python<'py>, shape: &[usize], dtype: &Py<PyArrayDescr>, zeroed: bool) -> PyResult<(Bound<'py, PyUntypedArray>, Out)> {
    let np = py.import("numpy")?;
    let make = if zeroed { "zeros" } else { "empty" };
    let array = np.getattr(make)?.call1((shape.to_vec(), dtype.bind(py)))?.cast_into::<PyUntypedArray>()?;
    let len = shape.iter().product::<usize>() * dtype.bind(py).itemsize();
    // SAFETY: numpy just allocated this C-contiguous array of `len` bytes; no other
    // reference to it exists yet, and the caller keeps `array` alive while writing.
    let ptr = unsafe { (*array.as_array_ptr()).data as *mut u8 };
    Ok((array, Out { ptr, len }))
}

/// Writable bytes of an array being filled (sent into `detach` closures).
pub struct Out {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the array behind `ptr` is kept alive by the caller's `Bound` and written
// by exactly one thread while the GIL is released.
unsafe impl Send for Out {}

impl Out {
    pub fn bytes(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: see `new_array`: exclusive, live, `len` bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// A contiguous 1-D array of `T` (keys, priorities), read without numpy's borrow
/// tracking; keeps the array alive.
pub struct Vector<'py, T: numpy::Element> {
    array: Bound<'py, numpy::PyArray1<T>>,
}

impl<'py, T: numpy::Element> Vector<'py, T> {
    /// `value` itself when it already is a contiguous `T` array of length `n`
    /// (when given), else what `reprise._convert.<helper>(value, n)` returns.
    pub fn new(py: Python<'py>, helper: &str, value: &Bound<'py, PyAny>, n: Option<usize>) -> PyResult<Self> {
        if let Ok(a) = value.cast::<numpy::PyArray1<T>>() {
            if a.is_c_contiguous() && n.is_none_or(|n| a.len() == n) {
                return Ok(Vector { array: a.clone() });
            }
        }
        let f = convert_module(py)?.getattr(helper)?;
        let out = match n {
            Some(n) => f.call1((value, n))?,
            None => f.call1((value,))?,
        };
        Ok(Vector { array: out.cast_into::<numpy::PyArray1<T>>()? })
    }

    pub fn len(&self) -> usize {
        self.array.len()
    }

    pub fn as_slice(&self) -> &[T] {
        let len = self.array.len();
        if len == 0 {
            return &[];
        }
        // SAFETY: the array is 1-D, C-contiguous (checked above or made so by the
        // helper), of element type T, alive as long as `self`.
        unsafe { std::slice::from_raw_parts((*self.array.as_array_ptr()).data as *const T, len) }
    }
}

/// The column indices of `fields` (`None`: all; empty: none), `NotFound` for an
/// unknown name.
pub fn select_fields(py: Python<'_>, sig: &reprise_core::Signature, fields: Option<Vec<String>>) -> PyResult<Option<Vec<usize>>> {
    match fields {
        None => Ok(None),
        Some(names) if names.is_empty() => Ok(Some(Vec::new())),
        Some(names) => sig.select(&names).map(Some).map_err(|e| not_found(py, e.to_string())),
    }
}

/// Whether two arrays hold the same bytes (numpy's `array_equal` for arrays of one
/// dtype, without its temporary and its second pass): None when either is not
/// C-contiguous, for the caller to compare another way. For checks of large
/// observations on the add path.
#[pyfunction]
pub fn same_bytes(a: &Bound<'_, PyUntypedArray>, b: &Bound<'_, PyUntypedArray>) -> Option<bool> {
    fn bytes<'a>(x: &'a Bound<'_, PyUntypedArray>) -> Option<&'a [u8]> {
        if !x.is_c_contiguous() {
            return None;
        }
        let len = x.len() * x.dtype().itemsize();
        if len == 0 {
            return Some(&[]);
        }
        // SAFETY: `x` is C-contiguous and borrowed for 'a; its buffer holds `len` bytes.
        Some(unsafe { std::slice::from_raw_parts((*x.as_array_ptr()).data as *const u8, len) })
    }
    if a.dtype().itemsize() != b.dtype().itemsize() || a.shape() != b.shape() {
        return Some(false);
    }
    Some(bytes(a)? == bytes(b)?)
}
