package activehours

import "testing"

func TestParse(t *testing.T) {
	t.Parallel()
	from, to, err := Parse("22:00-06:30")
	if err != nil || from != 22*60 || to != 6*60+30 {
		t.Errorf("Parse = %d, %d, %v", from, to, err)
	}
	for _, bad := range []string{"22-06", "25:00-01:00", "10:00-10:00", "10:00", ""} {
		if _, _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}
