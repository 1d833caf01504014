#include "common/metrics.h"

#include <gtest/gtest.h>

namespace ps {
namespace {

TEST(MetricsTest, SeriesCarryTheProcessLabelsAndCount) {
  MetricsOptions o;
  o.const_labels = {{"role", "test"}};
  auto m = Metrics::Start(o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)->port(), 0);  // no endpoint unless asked
  Counter c = (*m)->AddCounter("ps_things_total", "things");
  c.Increment();
  c.Increment(2);
  c.Increment(-5);  // counters never go down
  // The same name and labels are the same series.
  (*m)->AddCounter("ps_things_total", "things").Increment();
  (*m)->AddGauge("ps_level", "a level", {{"worker", "3"}}).Set(7.5);
  const std::string text = (*m)->Serialize();
  EXPECT_NE(text.find("ps_things_total{role=\"test\"} 4"), std::string::npos) << text;
  EXPECT_NE(text.find("ps_level{role=\"test\",worker=\"3\"} 7.5"), std::string::npos) << text;
}

TEST(MetricsTest, HistogramsTakeBucketCountsAtOnce) {
  auto m = Metrics::Start({});
  ASSERT_TRUE(m.ok());
  Histogram h = (*m)->AddHistogram("ps_staleness", "s", {0, 1, 2});
  h.Observe(0);
  h.ObserveMany({0, 2, 0, 1}, 2 + 5);  // two of 1, one above 2 (5)
  const std::string text = (*m)->Serialize();
  EXPECT_NE(text.find("ps_staleness_count 4"), std::string::npos) << text;
  EXPECT_NE(text.find("ps_staleness_sum 7"), std::string::npos) << text;
  EXPECT_NE(text.find("ps_staleness_bucket{le=\"1\"} 3"), std::string::npos) << text;
}

TEST(MetricsTest, DefaultHandlesDoNothing) {
  Counter c;
  Gauge g;
  Histogram h;
  c.Increment();
  g.Set(1);
  h.Observe(1);
}

TEST(MetricsTest, BadPortsAreErrors) {
  MetricsOptions o;
  o.port = 70000;
  auto bad = Metrics::Start(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("70000"), std::string::npos);
  o.host = "192.0.2.1";  // not an address of this machine: cannot bind
  o.port = 9;
  auto unbindable = Metrics::Start(o);
  ASSERT_FALSE(unbindable.ok());
  EXPECT_EQ(unbindable.status().code(), StatusCode::kUnavailable) << unbindable.status().ToString();
}

}  // namespace
}  // namespace ps
