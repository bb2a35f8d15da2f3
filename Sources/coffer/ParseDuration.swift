// ParseDuration reads the durations of options such as --idle-lock ("90", "30s", "15m", "2h", "1d").

/// Parses a duration such as "90", "30s", "15m", "2h" into seconds.
func parseDuration(_ text: String) -> Int64? {
    let units: [Character: Int64] = ["s": 1, "m": 60, "h": 3600, "d": 86400]
    guard let last = text.last else { return nil }
    if let unit = units[last], let value = Int64(text.dropLast()), value > 0 { return value * unit }
    if let value = Int64(text), value > 0 { return value }
    return nil
}
