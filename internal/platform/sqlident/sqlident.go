// Package sqlident parses and quotes SQL identifiers: schema-qualified
// table names written as in SQL (unquoted parts fold to lower case, quoted
// parts keep case and may hold any character), and quoting for SQL text.
// Names from configuration reach SQL only through Sanitize or QuoteIdent.
package sqlident

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// QualifiedName is a schema-qualified table name, unquoted and case-resolved
// as PostgreSQL's catalog stores it.
type QualifiedName struct {
	Schema, Name string
}

// ParseQualifiedName parses schema.name written as in SQL.
func ParseQualifiedName(s string) (QualifiedName, error) {
	var parts []string
	rest := strings.TrimSpace(s)
	for {
		part, r, err := parseIdent(rest)
		if err != nil {
			return QualifiedName{}, fmt.Errorf("table name %q: %w", s, err)
		}
		if len(part) > MaxIdentBytes {
			// PostgreSQL would cut it to its first 63 bytes, silently, and
			// name another table than the one meant.
			return QualifiedName{}, fmt.Errorf("table name %q: %s is %d bytes long; PostgreSQL names are at most %d bytes (it would read it as %s)",
				s, QuoteIfNeeded(part), len(part), MaxIdentBytes, QuoteIfNeeded(truncate(part)))
		}
		parts = append(parts, part)
		rest = strings.TrimSpace(r)
		if rest == "" {
			break
		}
		if rest[0] != '.' {
			return QualifiedName{}, fmt.Errorf("table name %q: unexpected %q after %s", s, rest, QuoteIfNeeded(part))
		}
		rest = strings.TrimSpace(rest[1:])
	}
	switch len(parts) {
	case 1:
		return QualifiedName{}, fmt.Errorf("table name %q: a schema is required (e.g. %s)", s, QualifiedName{"public", parts[0]})
	case 2:
		return QualifiedName{parts[0], parts[1]}, nil
	}
	return QualifiedName{}, fmt.Errorf("table name %q: want schema.name, got %d parts", s, len(parts))
}

// MaxIdentBytes is the longest name PostgreSQL keeps (NAMEDATALEN - 1).
const MaxIdentBytes = 63

// truncate cuts an identifier as PostgreSQL does: to 63 bytes, at a
// character boundary.
func truncate(s string) string {
	if len(s) <= MaxIdentBytes {
		return s
	}
	n := MaxIdentBytes
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func parseIdent(s string) (ident, rest string, err error) {
	if s == "" || s[0] == '.' {
		return "", "", errors.New("empty name part")
	}
	if s[0] == '"' {
		var b strings.Builder
		for i := 1; i < len(s); i++ {
			if s[i] != '"' {
				b.WriteByte(s[i])
				continue
			}
			if i+1 < len(s) && s[i+1] == '"' {
				b.WriteByte('"')
				i++
				continue
			}
			switch {
			case b.Len() == 0:
				return "", "", errors.New(`empty quoted identifier ""`)
			case strings.IndexByte(b.String(), 0) >= 0:
				return "", "", errors.New("identifier contains a NUL byte")
			}
			return b.String(), s[i+1:], nil
		}
		return "", "", errors.New("unterminated quoted identifier")
	}
	if !identStart(s[0]) {
		r := []rune(s)[0]
		return "", "", fmt.Errorf("unexpected %q; quote names that are not plain identifiers", r)
	}
	i := 1
	for i < len(s) && (identStart(s[i]) || s[i] >= '0' && s[i] <= '9' || s[i] == '$') {
		i++
	}
	return strings.ToLower(s[:i]), s[i:], nil
}

func identStart(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_'
}

// String spells q for people: parts are quoted only when they would not
// survive unquoted. Reserved words are not quoted; use Sanitize for SQL.
func (q QualifiedName) String() string {
	return QuoteIfNeeded(q.Schema) + "." + QuoteIfNeeded(q.Name)
}

// QuoteIfNeeded quotes s only when it would not survive unquoted (for
// messages; reserved words are not quoted).
func QuoteIfNeeded(s string) string {
	plain := s != "" && s[0] != '$' && (s[0] < '0' || s[0] > '9')
	for i := 0; plain && i < len(s); i++ {
		c := s[i]
		plain = c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '$'
	}
	if plain {
		return s
	}
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// Sanitize quotes q for inclusion in SQL text.
func (q QualifiedName) Sanitize() string {
	return pgx.Identifier{q.Schema, q.Name}.Sanitize()
}

// QuoteLiteral quotes s as an SQL string literal (standard_conforming_strings
// is on in every supported server).
func QuoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// QuoteIdent quotes a column name for inclusion in SQL text.
func QuoteIdent(s string) string {
	return pgx.Identifier{s}.Sanitize()
}
