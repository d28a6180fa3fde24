package sqlident

import (
	"slices"
	"strings"
)

// Closest is the candidate a mistyped name most likely meant: one that
// differs only in case first (the usual slip with a framework's quoted
// mixed-case names, or an unquoted name that folded to lower case), else
// the nearest within an edit distance of a third of the name's length (at
// most 3). ok is false when none is that close. Ties go to the candidate
// that sorts first, so that the suggestion does not change from run to run.
func Closest(name string, candidates []string) (best string, ok bool) {
	sorted := slices.Sorted(slices.Values(candidates))
	for _, c := range sorted {
		if c != name && strings.EqualFold(c, name) {
			return c, true
		}
	}
	limit := min(3, max(1, len([]rune(name))/3))
	bestDist := limit + 1
	for _, c := range sorted {
		if c == name {
			continue
		}
		if d := Distance(strings.ToLower(name), strings.ToLower(c)); d < bestDist {
			best, bestDist = c, d
		}
	}
	return best, bestDist <= limit
}

// Distance is the Levenshtein distance between a and b, in runes.
func Distance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}

// ClosestTable is the table of candidates name most likely meant (Closest
// on the whole name, schema included), spelled as SQL would need it: a
// name typed without quotes folds to lower case, so public.InboxState
// suggests public."InboxState".
func ClosestTable(name QualifiedName, candidates []QualifiedName) (QualifiedName, bool) {
	byKey := map[string]QualifiedName{}
	var keys []string
	for _, c := range candidates {
		k := c.Schema + "." + c.Name
		byKey[k] = c
		keys = append(keys, k)
	}
	k, ok := Closest(name.Schema+"."+name.Name, keys)
	return byKey[k], ok
}
