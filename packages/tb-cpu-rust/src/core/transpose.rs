//! The in-register 8×8 float32 transpose (AVX): the packed GEMM turns contiguous weight columns
//! into panel rows with it, the LLM panel GEMM and prefill attention turn weight / key rows into
//! panel columns.

/// Returns the columns of the 8×8 block whose rows are `r` (element j of row i becomes element
/// i of row j).
///
/// # Safety
/// The CPU must support AVX (every caller runs inside an AVX2 or AVX function).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
#[inline]
pub unsafe fn transpose_8x8(r: &[std::arch::x86_64::__m256; 8]) -> [std::arch::x86_64::__m256; 8] {
    use std::arch::x86_64::*;
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    // u0..u3 hold, per 128-bit lane L, elements 4L + q of rows 0..4; u4..u7 of rows 4..8
    [
        _mm256_permute2f128_ps::<0x20>(u0, u4),
        _mm256_permute2f128_ps::<0x20>(u1, u5),
        _mm256_permute2f128_ps::<0x20>(u2, u6),
        _mm256_permute2f128_ps::<0x20>(u3, u7),
        _mm256_permute2f128_ps::<0x31>(u0, u4),
        _mm256_permute2f128_ps::<0x31>(u1, u5),
        _mm256_permute2f128_ps::<0x31>(u2, u6),
        _mm256_permute2f128_ps::<0x31>(u3, u7),
    ]
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use std::arch::x86_64::*;

    #[test]
    fn transposes_an_8x8_block() {
        if !std::arch::is_x86_feature_detected!("avx") {
            return;
        }
        let m: Vec<f32> = (0..64).map(|i| i as f32).collect();
        let mut out = [0f32; 64];
        unsafe {
            let rows: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(m.as_ptr().add(8 * i)));
            for (j, v) in transpose_8x8(&rows).iter().enumerate() {
                _mm256_storeu_ps(out.as_mut_ptr().add(8 * j), *v);
            }
        }
        for i in 0..8 {
            for j in 0..8 {
                assert_eq!(out[8 * j + i], m[8 * i + j]);
            }
        }
    }
}
