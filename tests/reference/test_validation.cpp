#include <gtest/gtest.h>
#include "common.hpp"
