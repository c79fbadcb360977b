#include "common/csv.h"

namespace shardsim::inline common {

CsvRecords csv_records(const std::string& text) {
  CsvRecords out;
  std::vector<std::string> rec;
  std::string field;
  bool quoted = false, any = false;
  int line = 1, start = 1;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') ++line;
    if (quoted) {
      if (c == '"') {
        if (i + 1 < text.size() && text[i + 1] == '"') {
          field += '"';
          ++i;
        } else {
          quoted = false;
        }
      } else {
        field += c;
      }
    } else if (c == '"') {
      quoted = true;
      any = true;
    } else if (c == ',') {
      rec.push_back(field);
      field.clear();
      any = true;
    } else if (c == '\n') {
      rec.push_back(field);
      out.records.push_back(CsvRecord{start, std::move(rec)});
      rec.clear();
      field.clear();
      any = false;
      start = line;
    } else if (c != '\r') {
      field += c;
      any = true;
    }
  }
  out.truncated = any || !rec.empty();
  return out;
}

}  // namespace shardsim::common
