//! 24-bit packet sequence number arithmetic (InfiniBand PSNs wrap at 2^24).

/// PSNs are 24-bit.
pub const PSN_MASK: u32 = 0x00FF_FFFF;

/// Signed distance `a - b` in PSN space, in `-2^23 ..= 2^23 - 1`.
#[inline]
pub const fn psn_diff(a: u32, b: u32) -> i32 {
    // Shift the 24-bit difference into the top of an i32 and back to sign-extend.
    ((a.wrapping_sub(b) << 8) as i32) >> 8
}

/// `a > b` in PSN space.
#[inline]
pub const fn psn_gt(a: u32, b: u32) -> bool {
    psn_diff(a, b) > 0
}

/// `a >= b` in PSN space.
#[inline]
pub const fn psn_ge(a: u32, b: u32) -> bool {
    psn_diff(a, b) >= 0
}

/// `psn + n` wrapped to 24 bits.
#[inline]
pub const fn psn_add(psn: u32, n: u32) -> u32 {
    psn.wrapping_add(n) & PSN_MASK
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparison_wraps_at_2_pow_24() {
        assert!(psn_gt(1, 0));
        assert!(!psn_gt(0, 0));
        assert!(psn_gt(0, PSN_MASK), "0 follows 0xFFFFFF");
        assert!(psn_gt(5, 0xFF_FFF0));
        assert!(!psn_gt(0xFF_FFF0, 5));
        assert_eq!(psn_diff(0, PSN_MASK), 1);
        assert_eq!(psn_diff(PSN_MASK, 0), -1);
        assert_eq!(psn_diff(0x40_0000, 0), 0x40_0000);
        assert!(psn_ge(7, 7));
    }

    #[test]
    fn half_space_is_the_horizon() {
        // Exactly half the space apart: counted as behind (negative).
        assert_eq!(psn_diff(0x80_0000, 0), -0x80_0000);
        assert!(!psn_gt(0x80_0000, 0));
        assert!(psn_gt(0x7F_FFFF, 0));
    }

    #[test]
    fn add_wraps() {
        assert_eq!(psn_add(PSN_MASK, 1), 0);
        assert_eq!(psn_add(10, 5), 15);
    }
}
