// RFC 4180 CSV records: the one CSV reader (sweep results files, kernel timing tables). Fields may be quoted
// ("a, b" and "" for a quote); CR before LF is ignored; quoted fields may span lines.
#pragma once

#include <string>
#include <vector>

namespace shardsim::inline common {

struct CsvRecord {
  int line = 0;  // 1-based line of the file where the record starts
  std::vector<std::string> fields;
};

struct CsvRecords {
  std::vector<CsvRecord> records;  // complete records (each ended by a newline)
  bool truncated = false;          // the text ended inside a record (no final newline): that record is dropped
};

// TEXT split into records. Never throws; an unterminated quote runs to the end of TEXT (truncated).
CsvRecords csv_records(const std::string& text);

}  // namespace shardsim::common
