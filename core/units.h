// Byte quantities as users write them in configs ("2GiB", "512 MiB", "1.5TB", "4096") and as
// tables print them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace moepeak {

constexpr uint64_t KiB = 1ull << 10;
constexpr uint64_t MiB = 1ull << 20;
constexpr uint64_t GiB = 1ull << 30;
constexpr uint64_t TiB = 1ull << 40;

// Parses "<number>[ ]<unit>" with unit in B, KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB,
// TB (powers of 1000); no unit means bytes. Fractions are allowed with a unit ("1.5GiB").
// Returns nullopt for anything else (negative, empty, unknown unit, overflow).
std::optional<uint64_t> parse_bytes(std::string_view text);

// "1.50 GiB", "512.00 MiB", "17 B": binary units, two decimals above bytes.
std::string format_bytes(uint64_t bytes);

// Bytes as GiB with the given number of decimals, no unit: "1.50".
std::string format_gib(uint64_t bytes, int decimals = 2);

}  // namespace moepeak
