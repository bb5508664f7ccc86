//! Tensor descriptors: dtype, sizes and strides, validated before any kernel touches memory.
//!
//! Everything that crosses the FFI boundary is checked here: strides must be non-negative,
//! every size and extent must fit in `usize` without overflow, and a view must stay inside the
//! buffer it points into. Kernels only ever index through a validated `View`.

pub type Result<T> = std::result::Result<T, String>;

/// `Ok(())` when `cond` holds, else the error `what` (the kernels' precondition checks).
pub fn need(cond: bool, what: &str) -> Result<()> {
    if cond {
        Ok(())
    } else {
        Err(what.to_string())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    I64,
    Bool,
    // storage-only dtypes: copies, fills and the kernels that say so (linalg pivots, indices)
    F64,
    F16,
    BF16,
    I32,
    I16,
    I8,
    U8,
    // complex: interleaved (re, im) pairs; only the kernels of `complex` and `fft` compute in them
    C64,
    C128,
    C32,
}

impl DType {
    pub fn parse(name: &str) -> Result<DType> {
        match name.trim_start_matches("torch.") {
            "float32" | "f32" => Ok(DType::F32),
            "int64" | "i64" => Ok(DType::I64),
            "bool" => Ok(DType::Bool),
            "float64" | "f64" => Ok(DType::F64),
            "float16" | "f16" => Ok(DType::F16),
            "bfloat16" | "bf16" => Ok(DType::BF16),
            "int32" | "i32" => Ok(DType::I32),
            "int16" | "i16" => Ok(DType::I16),
            "int8" | "i8" => Ok(DType::I8),
            "uint8" | "u8" => Ok(DType::U8),
            "complex64" | "c64" => Ok(DType::C64),
            "complex128" | "c128" => Ok(DType::C128),
            "complex32" | "c32" => Ok(DType::C32),
            other => Err(format!("unsupported dtype {other:?}: native_cpu takes float32, int64 and bool")),
        }
    }

    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::I64 => 8,
            DType::Bool | DType::I8 | DType::U8 => 1,
            DType::F16 | DType::BF16 | DType::I16 => 2,
            DType::I32 => 4,
            DType::F64 => 8,
            DType::C64 => 8,
            DType::C128 => 16,
            DType::C32 => 4,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::I64 => "int64",
            DType::Bool => "bool",
            DType::F64 => "float64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::I32 => "int32",
            DType::I16 => "int16",
            DType::I8 => "int8",
            DType::U8 => "uint8",
            DType::C64 => "complex64",
            DType::C128 => "complex128",
            DType::C32 => "complex32",
        }
    }

    /// float32, int64 and bool: the dtypes every kernel and the elementwise engine compute in.
    pub fn is_core(self) -> bool {
        matches!(self, DType::F32 | DType::I64 | DType::Bool)
    }

    pub fn is_complex(self) -> bool {
        matches!(self, DType::C64 | DType::C128 | DType::C32)
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }
}

/// Converts sizes or strides that came from Python (signed) to `usize`, rejecting negatives.
pub fn to_usize(values: &[i64], what: &str) -> Result<Vec<usize>> {
    values
        .iter()
        .map(|&v| usize::try_from(v).map_err(|_| format!("{what} must be non-negative, got {values:?}")))
        .collect()
}

pub fn numel(sizes: &[usize]) -> Result<usize> {
    sizes
        .iter()
        .try_fold(1usize, |acc, &s| acc.checked_mul(s))
        .ok_or_else(|| format!("shape {sizes:?} overflows"))
}

/// Number of elements a strided layout spans (1 + largest offset), 0 for an empty tensor.
pub fn extent(sizes: &[usize], strides: &[usize]) -> Result<usize> {
    if sizes.len() != strides.len() {
        return Err(format!("sizes {sizes:?} and strides {strides:?} differ in rank"));
    }
    if sizes.contains(&0) {
        return Ok(0);
    }
    let mut last = 0usize;
    for (&s, &st) in sizes.iter().zip(strides) {
        let step = (s - 1).checked_mul(st).ok_or("stride overflow")?;
        last = last.checked_add(step).ok_or("stride overflow")?;
    }
    last.checked_add(1).ok_or_else(|| "stride overflow".to_string())
}

pub fn contiguous_strides(sizes: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; sizes.len()];
    let mut acc = 1usize;
    for i in (0..sizes.len()).rev() {
        strides[i] = acc;
        acc = acc.saturating_mul(sizes[i].max(1));
    }
    strides
}

/// True if two element ranges [a, a+na) and [b, b+nb) of bytes overlap.
pub fn ranges_overlap(a: usize, na: usize, b: usize, nb: usize) -> bool {
    na > 0 && nb > 0 && a < b.saturating_add(nb) && b < a.saturating_add(na)
}

/// A strided window into one buffer of the executor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    pub buf: usize,
    pub offset: usize,
    pub sizes: Vec<usize>,
    pub strides: Vec<usize>,
    pub dtype: DType,
}

impl View {
    /// A view from element 0 of buffer `buf` (strides in elements).
    pub fn new(buf: usize, sizes: &[usize], strides: &[usize], dtype: DType) -> View {
        View { buf, offset: 0, sizes: sizes.to_vec(), strides: strides.to_vec(), dtype }
    }
    /// A row-major view from element 0 of buffer `buf`.
    pub fn contiguous(buf: usize, sizes: &[usize], dtype: DType) -> View {
        View::new(buf, sizes, &contiguous_strides(sizes), dtype)
    }
    pub fn numel(&self) -> usize {
        self.sizes.iter().product()
    }
    pub fn rank(&self) -> usize {
        self.sizes.len()
    }
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1usize;
        for i in (0..self.sizes.len()).rev() {
            if self.sizes[i] != 1 && self.strides[i] != expected {
                return false;
            }
            expected *= self.sizes[i];
        }
        true
    }
    /// Checks that the view lies inside a buffer of `buf_numel` elements.
    pub fn check_within(&self, buf_numel: usize) -> Result<()> {
        let ext = extent(&self.sizes, &self.strides)?;
        if ext == 0 {
            return Ok(());
        }
        let end = self.offset.checked_add(ext).ok_or("view offset overflow")?;
        if end > buf_numel {
            return Err(format!(
                "view (offset {}, sizes {:?}, strides {:?}) reaches element {end} of a buffer of {buf_numel}",
                self.offset, self.sizes, self.strides
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extent_of_layouts() {
        assert_eq!(extent(&[2, 3], &[3, 1]).unwrap(), 6);
        assert_eq!(extent(&[3, 2], &[1, 3]).unwrap(), 6);
        assert_eq!(extent(&[4, 0], &[1, 1]).unwrap(), 0);
        assert_eq!(extent(&[4, 5], &[0, 1]).unwrap(), 5);
        assert!(extent(&[usize::MAX, 3], &[usize::MAX, 1]).is_err());
        assert!(extent(&[2], &[1, 1]).is_err());
    }

    #[test]
    fn negative_values_are_rejected() {
        assert!(to_usize(&[1, -1], "strides").is_err());
        assert_eq!(to_usize(&[1, 2], "strides").unwrap(), vec![1, 2]);
    }

    #[test]
    fn view_bounds() {
        let v = View { buf: 0, offset: 2, sizes: vec![2, 2], strides: vec![2, 1], dtype: DType::F32 };
        assert!(v.check_within(6).is_ok());
        assert!(v.check_within(5).is_err());
        assert!(v.is_contiguous());
    }

    #[test]
    fn overlap() {
        assert!(ranges_overlap(0, 10, 5, 10));
        assert!(!ranges_overlap(0, 10, 10, 10));
        assert!(!ranges_overlap(0, 0, 0, 10));
    }
}
