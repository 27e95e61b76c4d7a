//! The Python package's argument typing: Python objects into the instance's types, a value of
//! the wrong Python type (or beyond the Rust type) becoming `LLM_PARAM_INVALID`, as upstream's
//! `check_uint64`-style checks raise it. Nothing here decides what a value may be: the rules
//! are `hixl::datadist::args`'s. Lists of ints are read here, in one pass at native speed, not
//! walked in Python.

use hixl::datadist::{Error, LayerRange, RemoteCache};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyList, PyRange, PyRangeMethods, PyTuple};

/// The Python type name of `obj`, for messages.
fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// An `int` (a `bool` is not one here) as `T`, named `what`, of the range `kind` says
/// (`"uint32"`, `"int64"`, ...).
pub(super) fn int<'py, T: FromPyObject<'py>>(
    obj: &Bound<'py, PyAny>,
    what: &str,
    kind: &str,
) -> Result<T, Error> {
    if !obj.is_instance_of::<PyInt>() || obj.is_instance_of::<PyBool>() {
        return Err(Error::param(format!(
            "{what} should be int, but got {}",
            type_name(obj)
        )));
    }
    obj.extract::<T>()
        .map_err(|_| Error::param(format!("{what} ({obj}) should be in the range of {kind}")))
}

/// A `list` or `tuple` of `int`s, each a `uint64`.
pub(super) fn u64s(obj: &Bound<'_, PyAny>, what: &str) -> Result<Vec<u64>, Error> {
    // (this runs once per block: an item's name is made only for its message, and an `int`
    // is converted by the one C call that `extract` would make after checking it again)
    let each = |i: usize, item: Bound<'_, PyAny>| match item.downcast::<PyInt>() {
        Ok(n) if !item.is_instance_of::<PyBool>() => {
            // SAFETY: `n` is a live `int` (checked above, and held by `item`), which is all
            // `PyLong_AsUnsignedLongLong` takes; a value it cannot convert is reported through
            // the error indicator, taken right below while the GIL is held.
            let v = unsafe { pyo3::ffi::PyLong_AsUnsignedLongLong(n.as_ptr()) };
            if v == u64::MAX && PyErr::take(item.py()).is_some() {
                return int::<u64>(&item, &format!("{what}[{i}]"), "uint64");
            }
            Ok(v)
        }
        _ => int::<u64>(&item, &format!("{what}[{i}]"), "uint64"),
    };
    if let Ok(l) = obj.downcast::<PyList>() {
        return (l.iter().enumerate()).map(|(i, x)| each(i, x)).collect();
    }
    if let Ok(t) = obj.downcast::<PyTuple>() {
        return (t.iter().enumerate()).map(|(i, x)| each(i, x)).collect();
    }
    Err(Error::param(format!(
        "{what} should be list|tuple, but got {}",
        type_name(obj)
    )))
}

/// `None`, or a `range` of layers.
pub(super) fn layer_range(obj: &Bound<'_, PyAny>, what: &str) -> Result<Option<LayerRange>, Error> {
    if obj.is_none() {
        return Ok(None);
    }
    let Ok(r) = obj.downcast::<PyRange>() else {
        return Err(Error::param(format!(
            "{what} should be range, but got {}",
            type_name(obj)
        )));
    };
    let past = |_| Error::param(format!("{what} {obj} is past int64"));
    Ok(Some(LayerRange {
        start: r.start().map_err(past)? as i64,
        stop: r.stop().map_err(past)? as i64,
        step: r.step().map_err(past)? as i64,
    }))
}

/// A peer's cache as the Python layer packs it: `(0, cluster, cache_id, batch_index)`
/// (`CacheKeyByIdAndIndex`), `(1, cluster, model_id, 0)` (`BlocksCacheKey`), `(2, cluster,
/// req_id, model_id)` (`CacheKey`).
pub(super) fn remote(key: &Bound<'_, PyAny>) -> Result<RemoteCache, Error> {
    let t = key
        .downcast::<PyTuple>()
        .ok()
        .filter(|t| t.len() == 4)
        .ok_or_else(|| Error::param(format!("cache key {key}: a tuple of 4")))?;
    let at = |i: usize| t.get_item(i).map_err(|e| Error::param(e.to_string()));
    let kind: u32 = int(&at(0)?, "cache key kind", "uint32")?;
    let cluster_id = int(&at(1)?, "cluster_id", "uint64")?;
    Ok(match kind {
        0 => RemoteCache::ById {
            cluster_id,
            cache_id: int(&at(2)?, "cache_id", "int64")?,
            batch_index: int(&at(3)?, "batch_index", "uint32")?,
        },
        1 => RemoteCache::Blocks {
            cluster_id,
            model_id: int(&at(2)?, "model_id", "uint64")?,
        },
        2 => RemoteCache::Request {
            cluster_id,
            req_id: int(&at(2)?, "req_id", "uint64")?,
            model_id: int(&at(3)?, "model_id", "uint64")?,
        },
        _ => return Err(Error::param(format!("cache key kind {kind}"))),
    })
}
